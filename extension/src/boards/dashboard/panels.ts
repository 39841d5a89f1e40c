/**
 * The dashboard's lower panels: the run's events, every one the board keeps (the latest
 * EVENTS_KEPT, and whatever came after those that tell its failures and recoveries) in a box
 * that scrolls, following the latest unless scrolled back, the last lines of the ranks whose output is not shown under
 * the cell, and (with --profile, at the end) where a step's time went on each rank. Everything
 * from an engine is set as text.
 */
import { el } from '../../dom';
import { fmt } from '../../format';
import { IEvent, IProfile, IProfileRow } from './messages';
import { EVENTS_KEPT, inView } from './store';

// A profiled step's parts, as nbdist/notebook/debug/profile.py names them
const PARTS: [keyof IProfileRow, string][] = [
  ['compute_ms', 'computing'],
  ['comm_ms', 'communicating'],
  ['wait_ms', 'waiting for others'],
  ['data_ms', 'waiting for data']
];

/** The events box: its heading (with the count) and the list, which scrolls. */
export class EventList {
  readonly node = el('div', 'nbd-events');

  constructor() {
    this.node.append(this.heading, this.list);
    // following the latest unless the person scrolled back to read; a list laid out later
    // (drawn while out of view) scrolls to its end when it is
    this.list.addEventListener('scroll', () => {
      const list = this.list;
      this.follow = list.scrollHeight - list.scrollTop - list.clientHeight < 4;
    });
    new ResizeObserver(() => this.toEnd()).observe(this.list);
  }

  draw(events: IEvent[]): void {
    const shown = inView(events, EVENTS_KEPT);
    this.heading.textContent = shown.length > 8 ? `events (${shown.length})` : 'events';
    drawEvents(this.list, shown);
    this.node.dataset.events = String(shown.length);
    this.toEnd();
  }

  private toEnd(): void {
    if (this.follow) {
      this.list.scrollTop = this.list.scrollHeight;
    }
  }

  private follow = true;
  private readonly heading = el('div', 'nbd-section', 'events');
  private readonly list = el('div', 'nbd-event-list');
}

function drawEvents(box: HTMLElement, events: IEvent[]): void {
  box.textContent = '';
  if (!events.length) {
    box.append(el('div', 'nbd-quiet', 'none yet'));
  }
  for (const e of events) {
    const line = el('div', 'nbd-event nbd-event-' + e.kind);
    line.classList.toggle('nbd-event-kept', !!e.kept);
    const who = e.rank === null || e.rank === undefined ? '' : `rank ${e.rank}: `;
    line.append(el('span', 'nbd-event-kind', e.kind), el('span', '', ` ${who}${e.message}`));
    box.append(line);
  }
}

/** The last lines of one rank at a time, chosen in a list (each line once). */
export class LogTail {
  readonly node = el('div', 'nbd-logs');

  constructor() {
    const head = el('div', 'nbd-log-head');
    head.append(el('span', '', 'last lines of '), this.select);
    this.node.append(head, this.text);
    this.select.addEventListener('change', () => {
      this.rank = Number(this.select.value);
      this.draw(this.logs);
    });
  }

  /** `logs`: rank -> its last lines */
  draw(logs: Map<number, string[]>): void {
    this.logs = logs;
    const ranks = [...logs.keys()].sort((a, b) => a - b);
    this.node.style.display = ranks.length ? '' : 'none';
    if (this.select.options.length !== ranks.length) {
      this.select.textContent = '';
      for (const r of ranks) {
        const o = el('option', '', `rank ${r}`);
        o.value = String(r);
        this.select.append(o);
      }
    }
    if ((this.rank === null || !logs.has(this.rank)) && ranks.length) {
      this.rank = ranks[0];
    }
    if (this.rank !== null) {
      this.select.value = String(this.rank);
    }
    const lines = (this.rank !== null && logs.get(this.rank)) || [];
    this.text.textContent = lines.length ? lines.join('\n') : '(no output yet)';
  }

  private readonly select = el('select');
  private readonly text = el('pre', 'nbd-log-text');
  private logs = new Map<number, string[]>();
  private rank: number | null = null;
}

/** --profile: a bar per rank, its step split into computing, communicating, waiting for the
 * others and waiting for data, and where most of it goes. */
export function drawProfile(box: HTMLElement, p: IProfile | null): void {
  box.textContent = '';
  box.style.display = p ? '' : 'none';
  if (!p) {
    return;
  }
  box.append(el('div', 'nbd-section', "where a step's time goes (ms per step)"));
  const widest = Math.max(...p.rows.map(r => r.step_ms), 1e-9);
  for (const r of p.rows) {
    const line = el('div', 'nbd-profile-row');
    line.dataset.rank = String(r.rank);
    if (r.rank === p.straggler) {
      line.classList.add('nbd-straggler');
    }
    const bar = el('div', 'nbd-profile-bar');
    for (const [key, label] of PARTS) {
      const ms = Number(r[key]);
      const part = el('span', 'nbd-part nbd-part-' + key);
      part.style.width = `${(100 * ms) / widest}%`;
      part.title = `${label} ${fmt(ms)} ms`;
      bar.append(part);
    }
    line.append(
      el('span', 'nbd-profile-rank', `rank ${r.rank}`),
      bar,
      el('span', 'nbd-num', `${fmt(r.step_ms)} ms`),
      el('span', 'nbd-profile-mostly', r.mostly ?? '')
    );
    box.append(line);
  }
  const legend = el('div', 'nbd-profile-legend');
  for (const [key, label] of PARTS) {
    const item = el('span', 'nbd-key');
    item.append(el('span', 'nbd-part nbd-part-' + key), el('span', '', label));
    legend.append(item);
  }
  box.append(legend, el('div', 'nbd-profile-reason', p.reason));
}
