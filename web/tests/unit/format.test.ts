import { describe, expect, it } from "vitest";
import {
  describeFailure,
  formatBytes,
  formatDuration,
  formatMetric,
  formatProgress,
  formatRelative,
  formatSlots,
  isTerminal,
  parseTime,
  runDuration,
  slotNoun,
  slotsHeading,
  waitDuration,
} from "../../src/lib/format";

describe("formatting: times", () => {
  it("reads API timestamps as UTC, with or without a zone", () => {
    expect(parseTime("2026-11-29T10:34:45.319107Z")?.toISOString()).toBe("2026-11-29T10:34:45.319Z");
    expect(parseTime("2026-11-29T10:34:45")?.toISOString()).toBe("2026-11-29T10:34:45.000Z");
    expect(parseTime("2026-11-29T12:34:45+02:00")?.toISOString()).toBe("2026-11-29T10:34:45.000Z");
    expect(parseTime(null)).toBeNull();
    expect(parseTime("not a time")).toBeNull();
  });

  it("writes durations as their two largest units", () => {
    expect(formatDuration(850)).toBe("850ms");
    expect(formatDuration(42_000)).toBe("42s");
    expect(formatDuration(187_000)).toBe("3m 07s");
    expect(formatDuration(7_500_000)).toBe("2h 05m");
    expect(formatDuration(273_600_000)).toBe("3d 04h");
    expect(formatDuration(-5)).toBe("0ms");
    expect(formatDuration(null)).toBe("—");
  });

  it("writes relative times against a given now", () => {
    const now = Date.parse("2026-11-29T10:00:00Z");
    expect(formatRelative("2026-11-29T09:59:58Z", now)).toBe("just now");
    expect(formatRelative("2026-11-29T09:59:18Z", now)).toBe("42s ago");
    expect(formatRelative("2026-11-29T09:57:00Z", now)).toBe("3m ago");
    expect(formatRelative("2026-11-29T07:00:00Z", now)).toBe("3h ago");
    expect(formatRelative("2026-11-24T10:00:00Z", now)).toBe("5d ago");
    expect(formatRelative("2026-11-29T10:03:00Z", now)).toBe("in 3m");
  });
});

describe("formatting: sizes, metrics, progress", () => {
  it("writes sizes in binary units", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(1536)).toBe("1.50 KiB");
    expect(formatBytes(3.2 * 1024 ** 3)).toBe("3.20 GiB");
    expect(formatBytes(150 * 1024 ** 2)).toBe("150 MiB");
  });

  it("writes metric values compactly and exactly enough to compare", () => {
    expect(formatMetric(0.61254)).toBe("0.6125");
    expect(formatMetric(1200)).toBe("1200");
    expect(formatMetric(0.00001235)).toBe("1.235e-5");
    expect(formatMetric(32_000_000)).toBe("3.2e+7");
    expect(formatMetric(0)).toBe("0");
    expect(formatMetric(Number.NaN)).toBe("NaN");
    expect(formatMetric(-Infinity)).toBe("-∞");
  });

  it("writes progress with and without a total", () => {
    expect(formatProgress(12, 250)).toBe("12 / 250 (4.8%)");
    expect(formatProgress(12, null)).toBe("12");
    expect(formatProgress(null, null)).toBe("—");
  });

  it("describes failure categories", () => {
    expect(describeFailure("user_code")).toBe("user_code — the pipeline or a user hook raised");
    expect(describeFailure("something_new")).toBe("something_new");
    expect(describeFailure(null)).toBe("");
  });
});

describe("formatting: job durations", () => {
  const now = Date.parse("2026-11-29T10:10:00Z");
  const base = { created_at: "2026-11-29T10:00:00Z", started_at: null, finished_at: null };

  it("counts a queued job's wait up to now, and no run time", () => {
    const job = { ...base, status: "QUEUED" };
    expect(waitDuration(job, now)).toBe(600_000);
    expect(runDuration(job, now)).toBeNull();
  });

  it("counts a running job's run time up to now", () => {
    const job = { ...base, status: "RUNNING", started_at: "2026-11-29T10:01:00Z" };
    expect(waitDuration(job, now)).toBe(60_000);
    expect(runDuration(job, now)).toBe(540_000);
  });

  it("counts a finished job up to its end", () => {
    const job = { ...base, status: "SUCCEEDED", started_at: "2026-11-29T10:01:00Z", finished_at: "2026-11-29T10:05:00Z" };
    expect(runDuration(job, now)).toBe(240_000);
    expect(isTerminal(job.status)).toBe(true);
    expect(isTerminal("CANCELLING")).toBe(false);
  });
});

describe("slots named for their pool", () => {
  it("says GPUs, or CPU slots on a cpu pool", () => {
    expect(formatSlots(1, "nvidia-h200")).toBe("1 GPU");
    expect(formatSlots(8, undefined)).toBe("8 GPUs");
    expect(formatSlots(1, "cpu")).toBe("1 CPU slot");
    expect(formatSlots(2, "cpu")).toBe("2 CPU slots");
    expect(slotNoun("cpu")).toBe("CPU slots");
  });
  it("heads a column by what its pools have", () => {
    expect(slotsHeading(["cpu", "cpu"])).toBe("CPU slots");
    expect(slotsHeading(["h100", undefined])).toBe("GPUs");
    expect(slotsHeading(["cpu", "h100"])).toBe("Slots");
    expect(slotsHeading([])).toBe("GPUs");
  });
});
