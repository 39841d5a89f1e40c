/**
 * One number format per metric per board: the head, the workers' table and the metric's chart
 * readout write its numbers alike (`columnFormat`: the exponent form for all when any value needs
 * it), chosen from the metric's raw values, never its smoothed ones, so moving the smoothing
 * slider never changes how a number is written. Once a metric needs the exponent form it keeps
 * it for the board's life: a loss that falls to 5.72e-3 is not written 0.006316 a moment later.
 */
import { columnFormat, exponentForm } from '../../format';

export type Format = (v: number | null | undefined) => string;

export class MetricFormats {
  /** The format of `name`, given some of its latest raw values (any of them may need the
   * exponent form). */
  of(name: string, values: Iterable<number | null | undefined>): Format {
    const exponent = this.exponent.has(name) || exponentForm(values);
    const known = this.formats.get(name);
    if (known && known[0] === exponent) {
      return known[1];
    }
    if (exponent) {
      this.exponent.add(name);
    }
    const format = columnFormat([], 4, exponent);
    this.formats.set(name, [exponent, format]);
    return format;
  }

  private readonly exponent = new Set<string>();
  private readonly formats = new Map<string, [boolean, Format]>();
}
