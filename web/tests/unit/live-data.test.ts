import { QueryClient } from "@tanstack/react-query";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { jobKeys, type LogBuffer, mergeLogLines } from "../../src/api/jobs";
import { JobStreamSink } from "../../src/api/stream";
import type { JobEvent, LogLine } from "../../src/api/types";
import type { Series } from "../../src/lib/metrics";

const line = (id: number): LogLine => ({ id, attempt: 1, time: "2026-11-29T10:00:00Z", level: "INFO", source: "driver", message: `line ${id}` });
const msg = (event: string, data: unknown) => ({ event, data: JSON.stringify(data), id: "" });

describe("log lines merged from the first fetch and the stream (mergeLogLines)", () => {
  it("appends new lines and skips replayed ones", () => {
    const cur = [line(1), line(2), line(3)];
    expect(mergeLogLines(cur, [line(2), line(3), line(4)]).map((l) => l.id)).toEqual([1, 2, 3, 4]);
  });

  it("returns the same array when everything was seen", () => {
    const cur = [line(1), line(2)];
    expect(mergeLogLines(cur, [line(1), line(2)])).toBe(cur);
  });

  it("fills a gap in the middle in id order", () => {
    expect(mergeLogLines([line(1), line(5)], [line(3), line(6), line(6)]).map((l) => l.id)).toEqual([1, 3, 5, 6]);
  });
});

describe("stream messages written into the query cache (JobStreamSink)", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("batches metrics, logs and events, and merges them once their queries have loaded", () => {
    const qc = new QueryClient();
    const sink = new JobStreamSink(qc, "job_1");
    sink.handle(msg("metric", { name: "train/loss", step: 1, value: 0.5, time: "t" }));
    sink.handle(msg("log", line(1)));
    sink.handle(msg("event", { id: 1, time: "t", kind: "transition", from_status: null, to_status: "QUEUED", reason: "r" }));
    vi.advanceTimersByTime(JobStreamSink.FLUSH_MS);
    // Nothing is written before the first fetches: it would stand in for the history.
    expect(qc.getQueryData(jobKeys.metrics("job_1"))).toBeUndefined();

    qc.setQueryData<Series>(jobKeys.metrics("job_1"), { "train/loss": [{ step: 0, value: 1, time: "t" }] });
    qc.setQueryData<LogBuffer>(jobKeys.logs("job_1"), { lines: [], truncated: false });
    qc.setQueryData<JobEvent[]>(jobKeys.events("job_1"), []);
    vi.advanceTimersByTime(JobStreamSink.FLUSH_MS);
    expect(qc.getQueryData<Series>(jobKeys.metrics("job_1"))?.["train/loss"]?.map((p) => p.step)).toEqual([0, 1]);
    expect(qc.getQueryData<LogBuffer>(jobKeys.logs("job_1"))?.lines.map((l) => l.id)).toEqual([1]);
    expect(qc.getQueryData<JobEvent[]>(jobKeys.events("job_1"))).toHaveLength(1);
    sink.dispose();
  });

  it("applies a status change to the job and marks the lists stale", () => {
    const qc = new QueryClient();
    qc.setQueryData(jobKeys.detail("job_1"), { id: "job_1", status: "RUNNING", spec: {} });
    qc.setQueryData(jobKeys.list({}), { data: [] });
    const sink = new JobStreamSink(qc, "job_1");
    sink.handle(msg("status", { id: "job_1", status: "CANCELLING" }));
    sink.flush();
    expect(qc.getQueryData<{ status: string; spec: object }>(jobKeys.detail("job_1"))).toMatchObject({ status: "CANCELLING", spec: {} });
    expect(qc.getQueryState(jobKeys.list({}))?.isInvalidated).toBe(true);
  });

  it("reports the end of the stream", () => {
    const sink = new JobStreamSink(new QueryClient(), "job_1");
    expect(sink.handle(msg("log", line(1)))).toBe(false);
    expect(sink.handle({ event: "end", data: "{}", id: "" })).toBe(true);
    sink.dispose();
  });
});
