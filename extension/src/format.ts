/**
 * How nbdist writes numbers and durations, in one place: the sidebar, the run's board and the
 * sweep's board (bundled in by build-boards.mjs) all call these, so one figure reads the same
 * wherever it is shown. The kernel's own text (the events' "after 7.3 s") follows the same rule:
 * `nbdist.telemetry.format`, which tests/unit/test_format.py holds against this file.
 */

/** What a missing value shows as. */
export const MISSING = '–';

type Num = number | null | undefined;

function missing(v: Num): v is null | undefined {
  return v === null || v === undefined || !Number.isFinite(v);
}

/** Does `v` read better as 1.23e-4 than as a decimal? Tiny and huge magnitudes do. */
function wantsExponent(v: number): boolean {
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6);
}

/** A number in `digits` significant digits (exponent form when tiny or huge); '–' if missing. */
export function fmt(v: Num, digits = 4): string {
  if (missing(v)) {
    return MISSING;
  }
  if (wantsExponent(v)) {
    return v.toExponential(Math.max(0, digits - 2));
  }
  return groupThousands(String(Number(v.toPrecision(digits))));
}

/** A whole number with thousands separators: 3,080. */
export function fmtInt(v: Num): string {
  return missing(v) ? MISSING : groupThousands(String(Math.round(v)));
}

function groupThousands(text: string): string {
  const [whole, frac] = text.split('.');
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return frac === undefined ? grouped : `${grouped}.${frac}`;
}

/** Seconds as people read them: "7.3 s", "2 min 05 s", "1 h 02 min". */
export function fmtDuration(seconds: Num): string {
  if (missing(seconds)) {
    return MISSING;
  }
  const s = Math.max(0, seconds);
  if (s < 60) {
    return `${s.toFixed(1)} s`;
  }
  const whole = Math.round(s);
  if (whole < 3600) {
    return `${Math.floor(whole / 60)} min ${String(whole % 60).padStart(2, '0')} s`;
  }
  const minutes = Math.round(whole / 60);
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
}

/** Whether a column of these numbers is written in the exponent form (any of them needs it). */
export function exponentForm(values: Iterable<Num>): boolean {
  for (const v of values) {
    if (!missing(v) && wantsExponent(v)) {
      return true;
    }
  }
  return false;
}

/**
 * One format for a column of numbers (a table's loss column, a chart's readout): when any value
 * needs the exponent form, every value gets it, so 0.001658 never stands beside 2.90e-4.
 */
export function columnFormat(
  values: Num[],
  digits = 4,
  exponent = exponentForm(values)
): (v: Num) => string {
  if (!exponent) {
    return v => fmt(v, digits);
  }
  return v => (missing(v) ? MISSING : v.toExponential(Math.max(0, digits - 2)));
}

/**
 * An axis' tick labels: as `fmt` writes them, or all in the shortest exponent form (1e-3,
 * 2.5e-4) when any tick needs it, as a log axis spanning decades does.
 */
export function axisFormat(ticks: Num[]): string[] {
  const exponent = ticks.some(v => !missing(v) && wantsExponent(v));
  return ticks.map(v => {
    if (missing(v)) {
      return '';
    }
    if (!exponent || v === 0) {
      return fmt(v);
    }
    return Number(v.toPrecision(6)).toExponential();
  });
}
