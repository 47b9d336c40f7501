// The live feed of one job: `GET /v1/jobs/{id}/stream` read with fetch (EventSource cannot send the
// Authorization header) and written into the query cache, so every tab shows new status, events,
// metrics and log lines without polling. Reconnects with backoff until the job ends.
import { type QueryClient, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { isTerminal } from "../lib/format";
import { mergeSeries, type Point, type Series } from "../lib/metrics";
import { readSse, type SseMessage } from "../lib/sse";
import { authHeaders, handleUnauthenticated } from "./client";
import { jobKeys, type LogBuffer, mergeLogLines } from "./jobs";
import type { Job, JobDetail, JobEvent, LogLine } from "./types";

export type StreamState = "idle" | "connecting" | "live" | "reconnecting" | "ended" | "failed";

/** Buffers stream messages and writes them into the cache at most every FLUSH_MS (one render per batch). */
export class JobStreamSink {
  private metrics: Array<Point & { name: string }> = [];
  private logs: LogLine[] = [];
  private events: JobEvent[] = [];
  private status: Job | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  static FLUSH_MS = 250;

  constructor(
    private readonly qc: QueryClient,
    private readonly jobId: string,
  ) {}

  /** Handle one SSE message; returns true for `end` (the job reached a terminal status). */
  handle(msg: SseMessage): boolean {
    if (msg.event === "end") {
      this.flush();
      void this.qc.invalidateQueries({ queryKey: jobKeys.detail(this.jobId) });
      return true;
    }
    let data: unknown;
    try {
      data = JSON.parse(msg.data);
    } catch {
      return false; // not ours to interpret
    }
    switch (msg.event) {
      case "status":
        this.status = data as Job;
        break;
      case "event":
        this.events.push(data as JobEvent);
        break;
      case "metric":
        this.metrics.push(data as Point & { name: string });
        break;
      case "log":
        this.logs.push(data as LogLine);
        break;
      default:
        return false;
    }
    this.timer ??= setTimeout(() => this.flush(), JobStreamSink.FLUSH_MS);
    return false;
  }

  flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const { qc, jobId } = this;
    if (this.status) {
      const status = this.status;
      this.status = null;
      const before = qc.getQueryData<JobDetail>(jobKeys.detail(jobId));
      qc.setQueryData<JobDetail>(jobKeys.detail(jobId), (old) => (old ? { ...old, ...status } : old));
      if (before && before.status !== status.status) {
        void qc.invalidateQueries({ queryKey: jobKeys.lists() });
        // Allocations, checkpoints and rollouts change with the status: fetch them again.
        void qc.invalidateQueries({ queryKey: jobKeys.detail(jobId), exact: true });
        void qc.invalidateQueries({ queryKey: jobKeys.checkpoints(jobId) });
        void qc.invalidateQueries({ queryKey: jobKeys.rollouts(jobId) });
      }
    }
    // A batch waits until its query has loaded: writing into an empty key would stand in for the
    // first fetch and hide the history before the stream started.
    this.events = this.mergeWhenLoaded(jobKeys.events(jobId), this.events, (old: JobEvent[], batch) => {
      const seen = new Set(old.map((e) => e.id));
      const added = batch.filter((e) => !seen.has(e.id));
      return added.length ? [...old, ...added].sort((a, b) => a.id - b.id) : old;
    });
    this.metrics = this.mergeWhenLoaded(jobKeys.metrics(jobId), this.metrics, (old: Series, batch) =>
      mergeSeries(old, batch),
    );
    this.logs = this.mergeWhenLoaded(jobKeys.logs(jobId), this.logs, (old: LogBuffer, batch) => {
      const lines = mergeLogLines(old.lines, batch);
      return lines === old.lines ? old : { ...old, lines };
    });
    if (this.events.length || this.metrics.length || this.logs.length) {
      this.timer = setTimeout(() => this.flush(), JobStreamSink.FLUSH_MS);
    }
  }

  /** Merge `batch` into the cached data of `key`; returns what is left to merge later. */
  private mergeWhenLoaded<D, T>(key: readonly unknown[], batch: T[], merge: (old: D, batch: T[]) => D): T[] {
    if (!batch.length) return batch;
    if (this.qc.getQueryData<D>(key) === undefined) return batch;
    this.qc.setQueryData<D>(key, (old) => (old === undefined ? old : merge(old, batch)));
    return [];
  }

  dispose(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}

const BACKOFF_MS = [1_000, 2_000, 5_000, 10_000];

/**
 * Follow a job's stream while `enabled` (the job is not terminal). Returns the connection state for
 * the page's "live" indicator.
 */
export function useJobStream(jobId: string, enabled: boolean): StreamState {
  const qc = useQueryClient();
  const [state, setState] = useState<StreamState>("idle");

  useEffect(() => {
    if (!enabled) {
      setState((s) => (s === "idle" ? s : "ended"));
      return;
    }
    const abort = new AbortController();
    const sink = new JobStreamSink(qc, jobId);
    let failures = 0;

    const run = async () => {
      while (!abort.signal.aborted) {
        setState(failures ? "reconnecting" : "connecting");
        let ended = false;
        try {
          const res = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/stream`, {
            headers: authHeaders({ Accept: "text/event-stream" }),
            signal: abort.signal,
            cache: "no-store",
          });
          if (res.status === 401) {
            handleUnauthenticated();
            return;
          }
          if (res.status === 404 || res.status === 403) {
            setState("failed");
            return;
          }
          if (!res.ok || !res.body) throw new Error(`stream answered ${res.status}`);
          setState("live");
          failures = 0;
          await readSse(
            res.body,
            (msg) => {
              if (sink.handle(msg)) ended = true;
            },
            abort.signal,
          );
          sink.flush();
        } catch {
          if (abort.signal.aborted) return;
        }
        if (ended) {
          setState("ended");
          return;
        }
        const detail = qc.getQueryData<JobDetail>(jobKeys.detail(jobId));
        if (detail && isTerminal(detail.status)) {
          setState("ended");
          return;
        }
        const wait = BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)] as number;
        failures++;
        setState("reconnecting");
        await new Promise((r) => setTimeout(r, wait));
      }
    };
    void run();
    return () => {
      abort.abort();
      sink.flush();
      sink.dispose();
    };
  }, [qc, jobId, enabled]);

  return state;
}
