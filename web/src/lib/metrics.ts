// Metric series as the dashboard keeps them: sorted by step, one point per step, grouped by the
// Relax prefixes (rollout/, train/, eval/, perf/). Pure functions: unit-tested.

export interface Point {
  step: number;
  value: number;
  time: string;
}

export type Series = Record<string, Point[]>;

/** The Relax metric families, in the order the Metrics tab shows them; anything else goes last. */
export const METRIC_GROUPS = ["rollout", "train", "eval", "perf"] as const;
export const OTHER_GROUP = "other";

export function groupOf(name: string): string {
  const prefix = name.split("/", 1)[0] ?? "";
  return name.includes("/") && (METRIC_GROUPS as readonly string[]).includes(prefix) ? prefix : OTHER_GROUP;
}

/** Metric names by group, groups in METRIC_GROUPS order, names sorted within a group. */
export function groupMetricNames(names: Iterable<string>): Array<{ group: string; names: string[] }> {
  const by = new Map<string, string[]>();
  for (const n of names) {
    const g = groupOf(n);
    by.set(g, [...(by.get(g) ?? []), n]);
  }
  const order = [...METRIC_GROUPS, OTHER_GROUP];
  return order
    .filter((g) => by.has(g))
    .map((g) => ({ group: g, names: (by.get(g) ?? []).sort((a, b) => a.localeCompare(b)) }));
}

/**
 * Insert points into a sorted series (returns a new array when anything changed, else the same one).
 * A point at a step already present replaces it: a resumed attempt re-reports the steps after its
 * checkpoint, and the latest report is the one that counts.
 */
export function mergePoints(series: readonly Point[] | undefined, points: readonly Point[]): Point[] {
  const out = series ? [...series] : [];
  let changed = !series;
  for (const p of points) {
    const last = out[out.length - 1];
    if (!last || p.step > last.step) {
      out.push(p);
      changed = true;
      continue;
    }
    // Binary search for the first index with step >= p.step.
    let lo = 0;
    let hi = out.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((out[mid] as Point).step < p.step) lo = mid + 1;
      else hi = mid;
    }
    const at = out[lo];
    if (at && at.step === p.step) {
      if (at.value !== p.value || at.time !== p.time) {
        out[lo] = p;
        changed = true;
      }
    } else {
      out.splice(lo, 0, p);
      changed = true;
    }
  }
  return changed ? out : (series as Point[]);
}

/** Merge a batch of named points (as the SSE stream delivers them) into all series. */
export function mergeSeries(current: Series | undefined, batch: ReadonlyArray<Point & { name: string }>): Series {
  const byName = new Map<string, Point[]>();
  for (const { name, ...p } of batch) byName.set(name, [...(byName.get(name) ?? []), p]);
  const next: Series = { ...(current ?? {}) };
  for (const [name, points] of byName) {
    points.sort((a, b) => a.step - b.step);
    next[name] = mergePoints(next[name], points);
  }
  return next;
}

/**
 * Exponential moving average with TensorBoard's debiasing, so the first points are not pulled
 * towards zero. weight 0 returns the values unchanged.
 */
export function smooth(values: readonly number[], weight: number): number[] {
  if (weight <= 0) return [...values];
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (!Number.isFinite(v)) return v;
    last = last * weight + (1 - weight) * v;
    n++;
    return last / (1 - weight ** n);
  });
}

/**
 * At most `max` points for drawing: each bucket keeps its min and max (spikes stay visible), the
 * first and last points are always kept.
 */
export function decimate<T extends { value: number }>(points: readonly T[], max: number): T[] {
  if (points.length <= max || max < 4) return [...points];
  const buckets = Math.floor((max - 2) / 2);
  const inner = points.length - 2;
  const out: T[] = [points[0] as T];
  for (let b = 0; b < buckets; b++) {
    const from = 1 + Math.floor((b * inner) / buckets);
    const to = 1 + Math.floor(((b + 1) * inner) / buckets);
    let lo = from;
    let hi = from;
    for (let i = from; i < to; i++) {
      if ((points[i] as T).value < (points[lo] as T).value) lo = i;
      if ((points[i] as T).value > (points[hi] as T).value) hi = i;
    }
    if (from >= to) continue;
    for (const i of lo === hi ? [lo] : lo < hi ? [lo, hi] : [hi, lo]) out.push(points[i] as T);
  }
  out.push(points[points.length - 1] as T);
  return out;
}

/** "Nice" axis ticks (1, 2, 5 × 10^k) covering [min, max], about `count` of them. */
export function niceTicks(min: number, max: number, count = 4): number[] {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (min === max) return [min];
  const span = max - min;
  const raw = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const first = Math.ceil(min / step) * step;
  const ticks: number[] = [];
  for (let t = first; t <= max + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}
