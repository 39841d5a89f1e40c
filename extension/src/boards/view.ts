/**
 * A board's view, its life: drawn at its store's news; the theme mirrored on the root (the
 * charts follow the theme and their size themselves); undone on removal.
 */
import { IChanged } from './store';

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
  store: { views: Set<(changed: TChanged) => void> },
  draw: (changed: TChanged) => void,
  owned: IDestroyable[]
): () => void {
  const mirror = () => {
    root.dataset.theme = document.body.dataset.jpThemeLight || '';
  };
  mirror(); // from the start (JupyterLab and Notebook 7 both mark the body)
  const theme = new MutationObserver(mirror);
  theme.observe(document.body, {
    attributes: true,
    attributeFilter: ['data-jp-theme-light']
  });
  store.views.add(draw);
  draw({ all: true } as TChanged);
  return () => {
    store.views.delete(draw);
    theme.disconnect();
    for (const part of owned) {
      part.destroy();
    }
  };
}
