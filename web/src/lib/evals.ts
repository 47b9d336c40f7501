// A model's eval history as the dashboard shows it: evals grouped by model (their model_key), each
// model's verdicts over time, and each metric as a series over its evals. Pure functions: unit-tested.
import type { Point } from "./metrics";

export type EvalOutcome = "running" | "passed" | "failed" | "error";

/** What these functions read of an eval (a subset of the API's EvalPublic). */
export interface EvalLike {
  id: string;
  name: string;
  outcome: EvalOutcome;
  model_key: string;
  created_at: string;
  finished_at?: string | null;
  metric_values: Record<string, number | null>;
  thresholds: ReadonlyArray<{ metric: string; op: string; value: number; actual?: number | null; verdict: string }>;
}

export interface ModelHistory<E extends EvalLike = EvalLike> {
  model: string;
  /** Oldest first. */
  evals: E[];
  latest: E;
  counts: Record<EvalOutcome, number>;
}

const byTime = (a: EvalLike, b: EvalLike) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id);

/** The evals grouped by model, the model evaluated most recently first. */
export function groupByModel<E extends EvalLike>(evals: readonly E[]): ModelHistory<E>[] {
  const groups = new Map<string, E[]>();
  for (const ev of evals) {
    const list = groups.get(ev.model_key);
    if (list) list.push(ev);
    else groups.set(ev.model_key, [ev]);
  }
  const out: ModelHistory<E>[] = [];
  for (const [model, list] of groups) {
    const sorted = [...list].sort(byTime);
    const counts: Record<EvalOutcome, number> = { running: 0, passed: 0, failed: 0, error: 0 };
    for (const ev of sorted) counts[ev.outcome] += 1;
    out.push({ model, evals: sorted, latest: sorted[sorted.length - 1] as E, counts });
  }
  return out.sort((a, b) => byTime(b.latest, a.latest));
}

/**
 * Each metric of the ended evals as a series over them (x: the eval's index in time, oldest 0), for the
 * charts of a model's history. The main metrics (eval/<set>, eval/<set>-pass@k) only: lengths and
 * truncation stay in each eval's row.
 */
export function metricSeries(evals: readonly EvalLike[]): Record<string, Point[]> {
  const out: Record<string, Point[]> = {};
  [...evals].sort(byTime).forEach((ev, i) => {
    for (const [name, value] of Object.entries(ev.metric_values ?? {})) {
      if (value == null || !isMainMetric(name)) continue;
      (out[name] ??= []).push({ step: i, value, time: ev.finished_at ?? ev.created_at });
    }
  });
  return out;
}

export function isMainMetric(name: string): boolean {
  if (!name.startsWith("eval/")) return false;
  const rest = name.slice("eval/".length);
  return !rest.includes("/") && !rest.endsWith("-truncated_ratio");
}

/** The job-status class (its colour) that shows an eval's outcome. */
export function verdictClass(outcome: string): string {
  return { passed: "SUCCEEDED", failed: "FAILED", error: "FAILED", running: "RUNNING" }[outcome] ?? "QUEUED";
}

/** `eval/gsm8k >= 0.6 (0.62)`: a threshold and, once judged, the value it was judged on. */
export function describeThreshold(t: EvalLike["thresholds"][number]): string {
  const actual = t.actual == null ? "" : ` (${Number(t.actual.toPrecision(4))})`;
  return `${t.metric} ${t.op} ${t.value}${actual}`;
}
