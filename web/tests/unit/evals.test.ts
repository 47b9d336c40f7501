import { describe, expect, it } from "vitest";
import { evalKeys } from "../../src/api/evals";
import { describeThreshold, type EvalLike, groupByModel, isMainMetric, metricSeries, verdictClass } from "../../src/lib/evals";

function ev(id: string, model: string, at: string, outcome: EvalLike["outcome"], metrics: Record<string, number | null> = {}): EvalLike {
  return {
    id,
    name: `eval-${id}`,
    outcome,
    model_key: model,
    created_at: at,
    finished_at: outcome === "running" ? null : at,
    metric_values: metrics,
    thresholds: [{ metric: "eval/gsm8k", op: ">=", value: 0.6, actual: metrics["eval/gsm8k"] ?? null, verdict: "pass" }],
  };
}

describe("a model's eval history", () => {
  const evals = [
    ev("e3", "job:job_a", "2026-12-06T03:00:00Z", "failed", { "eval/gsm8k": 0.5 }),
    ev("e1", "job:job_a", "2026-12-06T01:00:00Z", "passed", { "eval/gsm8k": 0.7, "eval/gsm8k-pass@4": 0.9 }),
    ev("e2", "artifacts://models/tiny", "2026-12-06T02:00:00Z", "error"),
    ev("e4", "job:job_a", "2026-12-06T04:00:00Z", "running"),
  ];

  it("groups evals by model, oldest first within, the model evaluated last first", () => {
    const groups = groupByModel(evals);
    expect(groups.map((g) => g.model)).toEqual(["job:job_a", "artifacts://models/tiny"]);
    expect(groups[0]?.evals.map((e) => e.id)).toEqual(["e1", "e3", "e4"]);
    expect(groups[0]?.latest.id).toBe("e4");
    expect(groups[0]?.counts).toEqual({ running: 1, passed: 1, failed: 1, error: 0 });
    expect(groups[1]?.counts.error).toBe(1);
    expect(groupByModel([])).toEqual([]);
  });

  it("makes each main metric a series over the evals, in time order", () => {
    const series = metricSeries(groupByModel(evals)[0]?.evals ?? []);
    expect(series["eval/gsm8k"]?.map((p) => [p.step, p.value])).toEqual([
      [0, 0.7],
      [1, 0.5],
    ]);
    expect(series["eval/gsm8k-pass@4"]?.map((p) => p.step)).toEqual([0]);
    expect(Object.keys(series).sort()).toEqual(["eval/gsm8k", "eval/gsm8k-pass@4"]);
  });

  it("keeps lengths and truncation out of the charts", () => {
    expect(isMainMetric("eval/gsm8k")).toBe(true);
    expect(isMainMetric("eval/gsm8k-pass@2")).toBe(true);
    expect(isMainMetric("eval/gsm8k/response_len")).toBe(false);
    expect(isMainMetric("eval/gsm8k-truncated_ratio")).toBe(false);
    expect(isMainMetric("rollout/reward")).toBe(false);
  });

  it("shows verdicts with the job statuses' colours and thresholds with their values", () => {
    expect(["passed", "failed", "error", "running", "other"].map(verdictClass)).toEqual([
      "SUCCEEDED",
      "FAILED",
      "FAILED",
      "RUNNING",
      "QUEUED",
    ]);
    expect(describeThreshold({ metric: "eval/x", op: ">=", value: 0.6, actual: 0.623456, verdict: "pass" })).toBe(
      "eval/x >= 0.6 (0.6235)",
    );
    expect(describeThreshold({ metric: "eval/x", op: "<", value: 2, actual: null, verdict: "pending" })).toBe("eval/x < 2");
  });

  it("keys one model's history apart from every eval", () => {
    expect(evalKeys.list(null)).toEqual(["evals", "list", null]);
    expect(evalKeys.list(" job:job_a ")).toEqual(["evals", "list", "job:job_a"]);
    expect(evalKeys.list("")).toEqual(evalKeys.list(null));
    expect(evalKeys.detail("ev_1")).toEqual(["evals", "detail", "ev_1"]);
  });
});
