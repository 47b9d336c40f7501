import { describe, expect, it } from "vitest";
import { decimate, groupMetricNames, groupOf, mergePoints, mergeSeries, niceTicks, type Point, smooth } from "../../src/lib/metrics";

const pt = (step: number, value = step): Point => ({ step, value, time: `t${step}` });

describe("metric grouping by Relax prefix", () => {
  it("puts rollout/, train/, eval/, perf/ first, in that order, and the rest under other", () => {
    const groups = groupMetricNames(["perf/step_time", "train/loss", "custom", "eval/arith/acc", "rollout/reward", "train/entropy", "foo/bar"]);
    expect(groups).toEqual([
      { group: "rollout", names: ["rollout/reward"] },
      { group: "train", names: ["train/entropy", "train/loss"] },
      { group: "eval", names: ["eval/arith/acc"] },
      { group: "perf", names: ["perf/step_time"] },
      { group: "other", names: ["custom", "foo/bar"] },
    ]);
    expect(groupOf("train")).toBe("other");
  });
});

describe("merging metric points (mergePoints, mergeSeries)", () => {
  it("appends, inserts out of order, and keeps one point per step (the latest report)", () => {
    const s = mergePoints([pt(1), pt(3)], [pt(4), pt(2), { step: 3, value: 9, time: "again" }]);
    expect(s.map((p) => [p.step, p.value])).toEqual([
      [1, 1],
      [2, 2],
      [3, 9],
      [4, 4],
    ]);
  });

  it("returns the same array when nothing changed (no re-render)", () => {
    const s = [pt(1), pt(2)];
    expect(mergePoints(s, [pt(2)])).toBe(s);
  });

  it("merges a stream batch into named series without touching the others", () => {
    const before = { "train/loss": [pt(1)], "perf/step_time": [pt(1)] };
    const after = mergeSeries(before, [
      { name: "train/loss", ...pt(3) },
      { name: "train/loss", ...pt(2) },
      { name: "rollout/reward", ...pt(1) },
    ]);
    expect(after["train/loss"]?.map((p) => p.step)).toEqual([1, 2, 3]);
    expect(after["rollout/reward"]).toHaveLength(1);
    expect(after["perf/step_time"]).toBe(before["perf/step_time"]);
  });
});

describe("chart helpers", () => {
  it("smooths with a debiased EMA (first point unchanged, weight 0 is identity)", () => {
    expect(smooth([1, 2, 3], 0)).toEqual([1, 2, 3]);
    const s = smooth([10, 10, 10], 0.9);
    s.forEach((v) => expect(v).toBeCloseTo(10));
    expect(smooth([0, 10], 0.5)[1]).toBeCloseTo(10 * 0.5 / 0.75);
  });

  it("decimates long series but keeps the ends and the spikes", () => {
    const points = Array.from({ length: 10_000 }, (_, i) => ({ step: i, value: i === 5000 ? 1000 : i % 7 }));
    const d = decimate(points, 200);
    expect(d.length).toBeLessThanOrEqual(200);
    expect(d[0]?.step).toBe(0);
    expect(d[d.length - 1]?.step).toBe(9999);
    expect(d.some((p) => p.value === 1000)).toBe(true);
    expect(d.map((p) => p.step)).toEqual([...d.map((p) => p.step)].sort((a, b) => a - b));
    expect(decimate(points.slice(0, 50), 200)).toHaveLength(50);
  });

  it("picks 1-2-5 ticks inside the range", () => {
    expect(niceTicks(0, 1, 4)).toEqual([0, 0.5, 1]);
    expect(niceTicks(0, 250, 4)).toEqual([0, 100, 200]);
    expect(niceTicks(-0.3, 0.3, 3)).toEqual([-0.2, 0, 0.2]);
    expect(niceTicks(5, 5)).toEqual([5]);
  });
});
