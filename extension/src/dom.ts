/**
 * Elements made as the charts and the boards make them, without React: a class, and text set
 * as text (what they show may come from engines: host names, log lines, metric names).
 */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
