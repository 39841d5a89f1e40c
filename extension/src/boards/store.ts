/**
 * A board's state in the browser, one per widget model, shared by all its views. The kernel's
 * `history` (everything so far, decimated) replaces it; its custom messages ({kind: "delta",
 * seq}) add what is new. A board's store says what it holds (`reset`) and how a message goes in
 * (`merge`, returning what changed); views subscribe to `views`. Made when the front end makes
 * the model (whether or not a view is drawn yet, the tab in front or not), it tells the kernel
 * so once: `widget.seen` (read between cells).
 *
 * A board that cannot draw says why, and mends what it can. A message the store cannot read is
 * a `problem` (one line on every view); a delta that skips a sequence number (a message lost on
 * the way) or a kernel silent while its run goes (`stale`) makes the store ask the kernel for the
 * whole board again (`{kind: "resend"}`: answered at once between cells, else when the cell
 * ends, with the finished board and its picture). The store's listeners are in place before it
 * reads the model's first state, so a first state it cannot read never leaves it deaf.
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
  /** The store's problem, or its picture, changed. */
  problem?: boolean;
}

/** Seconds without news from a running board's kernel before the store asks for it again. */
export const STALE_AFTER = 15;
/** Seconds between two requests for the whole board. */
const ASK_EVERY = 5;

/** What a board reads of its anywidget model: two synced traits (`{}` until the kernel sets
 * them), the finished board's picture (an SVG, the run's dashboard only), the kernel's custom
 * messages, and a way to answer (`seen`; `resend`: the whole board again, please). */
export interface IBoardModel<THead, THistory> {
  get(name: 'head'): Partial<THead> | null;
  get(name: 'history'): Partial<THistory> | null;
  get(name: 'picture'): string | null | undefined;
  on(event: 'change:head' | 'change:history' | 'change:picture', callback: () => void): void;
  on(event: 'msg:custom', callback: (content: unknown) => void): void;
  send(content: { kind: 'seen' } | { kind: 'resend'; seq: number; why: string }): void;
}

export abstract class BoardStore<
  THead,
  TMessage extends IMessage,
  TChanged extends IChanged = IChanged
> {
  readonly views = new Set<(changed: TChanged) => void>();

  /** Why the board cannot show everything, in one line; null while all is well. */
  problem: string | null = null;
  /** When news last came from the kernel (ms, the page's clock). */
  heard = Date.now();

  constructor(readonly model: IBoardModel<THead, TMessage>) {
    this.reset();
    // listening first: a first state that cannot be read must not leave the store deaf
    model.on('change:history', () => this.guard(() => this.load(model.get('history'))));
    model.on('change:head', () => this.guard(() => this.notify({ head: true } as TChanged)));
    model.on('change:picture', () => this.notify({ problem: true } as TChanged));
    model.on('msg:custom', content => this.guard(() => this.delta(content as TMessage | null)));
    this.guard(() => this.load(model.get('history')));
    model.send({ kind: 'seen' });
  }

  /** The finished board's picture (SVG text), once the kernel sent it; '' before. */
  picture(): string {
    return this.model.get('picture') || '';
  }

  /** Ask the kernel for the whole board again (at most every few seconds), saying why. */
  askAgain(why: string): void {
    const now = Date.now();
    if (now - this.asked < ASK_EVERY * 1000) {
      return;
    }
    this.asked = now;
    this.model.send({ kind: 'resend', seq: this.seq, why });
  }

  /** Whether the kernel has been silent too long while its run goes (or before its first
   * word): then the store has asked it for the whole board again. */
  stale(running: boolean): number {
    const quiet = (Date.now() - this.heard) / 1000;
    if (!running || quiet < STALE_AFTER) {
      return 0;
    }
    this.askAgain(`no news for ${Math.round(quiet)} s`);
    return quiet;
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

  /** Everything so far (decimated): replaces what this store holds (a resent history of the
   * same sequence number too: it answers a request, and mends a gap). */
  private load(h: Partial<TMessage> | null): void {
    if (!h || !h.seq || h.seq < this.seq) {
      return;
    }
    this.reset();
    this.seq = h.seq;
    this.gap = false;
    this.problem = null;
    this.merge(h as TMessage);
    this.notify({ all: true } as TChanged);
  }

  /** What changed since the last message: appended to what this store holds. A skipped
   * sequence number is a lost message: the whole board is asked for again. */
  private delta(msg: TMessage | null): void {
    if (!msg || msg.kind !== 'delta' || msg.seq <= this.seq) {
      return;
    }
    if (msg.seq > this.seq + 1 && !this.gap) {
      this.gap = true;
      this.askAgain(`message ${this.seq + 1} was lost`);
    }
    this.seq = msg.seq;
    this.notify(this.merge(msg));
  }

  /** Run `f`, a message's handling: news from the kernel; what it throws is the store's
   * problem (one line on the board), never an exception out of the model's callbacks. */
  private guard(f: () => void): void {
    this.heard = Date.now();
    try {
      f();
    } catch (err) {
      this.problem = `could not read the kernel's message: ${describe(err)}`;
      this.askAgain(this.problem);
      this.notify({ problem: true } as TChanged);
    }
  }

  /** Every view told; one that throws does not keep the others from drawing (it says why on
   * its own root: `follow`). */
  private notify(changed: TChanged): void {
    for (const view of this.views) {
      try {
        view(changed);
      } catch {
        // the view has shown its problem itself
      }
    }
  }

  private seq = 0;
  private gap = false;
  private asked = 0;
}

/** An error as one line: its kind and message. */
export function describe(err: unknown): string {
  const line = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  return line.split('\n')[0].slice(0, 300);
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
