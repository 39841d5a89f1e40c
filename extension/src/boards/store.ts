/**
 * A board's state in the browser, one per widget model, shared by all its views. The kernel's
 * `history` (everything so far, decimated) replaces it; its custom messages ({kind: "delta",
 * seq}) add what is new. A board's store says what it holds (`reset`) and how a message goes in
 * (`merge`, returning what changed); views subscribe to `views`. Made when the front end makes
 * the model (whether or not a view is drawn yet, the tab in front or not), it tells the kernel
 * so once: `widget.seen` (read between cells).
 */

/** What every message from the kernel carries: its kind, and its place in the sequence. */
export interface IMessage {
  kind: 'history' | 'delta';
  seq: number;
}

/** What a message changed in a store: the parts of a view to draw again. */
export interface IChanged {
  /** Everything (a history, a new view). */
  all?: boolean;
  head?: boolean;
  /** The metrics whose curves changed. */
  metrics?: Set<string>;
  rows?: boolean;
}

/** What a board reads of its anywidget model: two synced traits (`{}` until the kernel sets
 * them), the kernel's custom messages, and a way to answer. */
export interface IBoardModel<THead, THistory> {
  get(name: 'head'): Partial<THead> | null;
  get(name: 'history'): Partial<THistory> | null;
  on(event: 'change:head' | 'change:history', callback: () => void): void;
  on(event: 'msg:custom', callback: (content: unknown) => void): void;
  send(content: { kind: 'seen' }): void;
}

export abstract class BoardStore<
  THead,
  TMessage extends IMessage,
  TChanged extends IChanged = IChanged
> {
  readonly views = new Set<(changed: TChanged) => void>();

  constructor(readonly model: IBoardModel<THead, TMessage>) {
    this.reset();
    this.load(model.get('history'));
    model.on('change:history', () => this.load(model.get('history')));
    model.on('change:head', () => this.notify({ head: true } as TChanged));
    model.on('msg:custom', content => this.delta(content as TMessage | null));
    model.send({ kind: 'seen' });
  }

  /** The progress line: `{}` before the kernel's first. */
  head(): Partial<THead> {
    return this.model.get('head') || {};
  }

  /** Empty what this store holds. (Called by the constructor: a subclass declares its fields,
   * and sets them here.) */
  protected abstract reset(): void;

  /** A message into what this store holds (a history's curves replace, a delta's append). */
  protected abstract merge(msg: TMessage): TChanged;

  /** Everything so far (decimated): replaces what this store holds. */
  private load(h: Partial<TMessage> | null): void {
    if (!h || !h.seq || h.seq <= this.seq) {
      return;
    }
    this.reset();
    this.seq = h.seq;
    this.merge(h as TMessage);
    this.notify({ all: true } as TChanged);
  }

  /** What changed since the last message: appended to what this store holds. */
  private delta(msg: TMessage | null): void {
    if (!msg || msg.kind !== 'delta' || msg.seq <= this.seq) {
      return;
    }
    this.seq = msg.seq;
    this.notify(this.merge(msg));
  }

  private notify(changed: TChanged): void {
    for (const view of this.views) {
      view(changed);
    }
  }

  private seq = 0;
}

/** One store per model (a notebook may show a board in several views). */
const stores = new WeakMap<object, unknown>();

function storeOf<TModel extends object, TStore>(
  model: TModel,
  Kind: new (model: TModel) => TStore
): TStore {
  if (!stores.has(model)) {
    stores.set(model, new Kind(model));
  }
  return stores.get(model) as TStore;
}

/**
 * A board's anywidget module: its store made in `initialize`, before any view, so that no delta
 * is missed while none is drawn; each view drawn by `render`, which returns how to undo it.
 */
export function boardModule<TModel extends object, TStore>(
  Kind: new (model: TModel) => TStore,
  render: (root: HTMLElement, store: TStore) => () => void
): {
  initialize(props: { model: TModel }): void;
  render(props: { model: TModel; el: HTMLElement }): () => void;
} {
  return {
    initialize({ model }) {
      storeOf(model, Kind);
    },
    render({ model, el }) {
      return render(el, storeOf(model, Kind));
    }
  };
}
