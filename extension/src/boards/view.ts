/**
 * A board's view, its life: drawn at its store's news; the theme mirrored on the root (the
 * charts follow the theme and their size themselves); undone on removal.
 *
 * A board that cannot draw says why, in one line at its top (`.nbdist-board-problem`): an
 * exception while drawing (then the finished board's picture is shown under that line once the
 * kernel has sent it), a message the store could not read, or a kernel silent for a while as its
 * run goes (the store asks it for the whole board again).
 */
import { el } from '../dom';
import { describe, IChanged } from './store';

/** What a view reads of its store, besides drawing at its news. */
interface IFollowed<TChanged> {
  views: Set<(changed: TChanged) => void>;
  problem: string | null;
  head(): object;
  picture(): string;
  stale(running: boolean): number;
}

/** What a view holds that must be freed: its charts, its grid. */
interface IDestroyable {
  destroy(): void;
}

/** A key for the charts of one view, which share a cursor (their step). */
export function syncKey(prefix: string): string {
  return `${prefix}-${Math.random().toString(36).slice(2)}`;
}

/**
 * Draw the view at `root` now and at each of `store`'s changes; returns how to undo it (stop
 * listening, free `owned`), as anywidget's render does.
 */
export function follow<TChanged extends IChanged>(
  root: HTMLElement,
  store: IFollowed<TChanged>,
  draw: (changed: TChanged) => void,
  owned: IDestroyable[]
): () => void {
  const problem = el('div', 'nbdist-board-problem');
  const picture = el('img', 'nbdist-board-picture');
  picture.alt = 'the finished board';
  root.prepend(problem, picture);
  let failed: string | null = null; // this view's own drawing failed
  let quiet = 0; // seconds without news from a running kernel
  const say = () => {
    const line = failed
      ? `this board could not draw: ${failed}` +
        (store.picture() ? ' (the finished board below)' : " (the run's picture comes at its end)")
      : store.problem ||
        (quiet
          ? `no news from the kernel for ${Math.round(quiet)} s: asked it for the whole board again`
          : '');
    problem.textContent = line;
    problem.style.display = line ? '' : 'none';
    root.dataset.problem = line;
    const svg = failed ? store.picture() : '';
    picture.style.display = svg ? '' : 'none';
    if (svg && picture.dataset.length !== String(svg.length)) {
      picture.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(svg);
      picture.dataset.length = String(svg.length);
    }
  };
  const safeDraw = (changed: TChanged) => {
    try {
      draw(changed);
      if (changed.all) {
        failed = null;
      }
    } catch (err) {
      failed = describe(err);
      console.error('nbdist board:', err);
      say();
      throw err;
    }
    say();
  };
  // a running board whose kernel went silent (or never spoke) says so, and asks again
  const watchdog = window.setInterval(() => {
    const status = String((store.head() as { status?: string }).status ?? '');
    const running = !status || status.startsWith('running') || status.startsWith('recovering');
    const was = quiet;
    quiet = store.stale(running);
    if (quiet || was) {
      say();
    }
  }, 2000);
  const mirror = () => {
    root.dataset.theme = document.body.dataset.jpThemeLight || '';
  };
  mirror(); // from the start (JupyterLab and Notebook 7 both mark the body)
  const theme = new MutationObserver(mirror);
  theme.observe(document.body, {
    attributes: true,
    attributeFilter: ['data-jp-theme-light']
  });
  store.views.add(safeDraw);
  try {
    safeDraw({ all: true } as TChanged);
  } catch {
    // said on the board
  }
  return () => {
    store.views.delete(safeDraw);
    window.clearInterval(watchdog);
    theme.disconnect();
    for (const part of owned) {
      part.destroy();
    }
  };
}
