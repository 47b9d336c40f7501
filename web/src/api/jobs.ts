// Jobs: the query-key factory, query options and mutations, with their invalidation rules.
//
// Keys nest so that invalidating a prefix refreshes everything under it:
//   jobKeys.all                 ["jobs"]
//   jobKeys.lists()             ["jobs", "list"]                 every jobs table
//   jobKeys.list(filter)        ["jobs", "list", {filter}]       one table (status, name, queue, after)
//   jobKeys.details()           ["jobs", "detail"]
//   jobKeys.detail(id)          ["jobs", "detail", id]           the job and, below it, its
//   jobKeys.events(id) / metrics(id) / logs(id) / checkpoints(id) / rollouts(id)
// Invalidation rules: submitting invalidates lists(); cancelling invalidates lists() and detail(id)
// (the job and its children). The SSE stream (stream.ts) writes events, metrics and logs into their
// keys directly instead of invalidating them.
import { queryOptions, useMutation, useQueryClient } from "@tanstack/react-query";
import { isTerminal } from "../lib/format";
import type { Series } from "../lib/metrics";
import { api, unwrap } from "./client";
import type { JobCreate, LogLine } from "./types";

export interface JobFilter {
  status?: readonly string[];
  name?: string;
  queue?: string;
  after?: string;
  limit?: number;
}

/** The filter in canonical form (sorted statuses, no empty values): equal filters, equal keys. */
export function normalizeFilter(filter: JobFilter): JobFilter {
  const out: JobFilter = {};
  const status = [...new Set((filter.status ?? []).map((s) => s.toUpperCase()).filter(Boolean))].sort();
  if (status.length) out.status = status;
  if (filter.name?.trim()) out.name = filter.name.trim();
  if (filter.queue?.trim()) out.queue = filter.queue.trim();
  if (filter.after) out.after = filter.after;
  if (filter.limit) out.limit = filter.limit;
  return out;
}

export const jobKeys = {
  all: ["jobs"] as const,
  lists: () => [...jobKeys.all, "list"] as const,
  list: (filter: JobFilter) => [...jobKeys.lists(), normalizeFilter(filter)] as const,
  details: () => [...jobKeys.all, "detail"] as const,
  detail: (id: string) => [...jobKeys.details(), id] as const,
  events: (id: string) => [...jobKeys.detail(id), "events"] as const,
  metrics: (id: string) => [...jobKeys.detail(id), "metrics"] as const,
  logs: (id: string) => [...jobKeys.detail(id), "logs"] as const,
  checkpoints: (id: string) => [...jobKeys.detail(id), "checkpoints"] as const,
  rollouts: (id: string) => [...jobKeys.detail(id), "rollouts"] as const,
};

/** How often live views poll (ms); the SSE stream makes a job's own page faster than this. */
export const LIVE_REFRESH_MS = 5_000;

export function jobsListQuery(filter: JobFilter, opts: { live?: boolean } = {}) {
  const f = normalizeFilter(filter);
  return queryOptions({
    queryKey: jobKeys.list(f),
    queryFn: ({ signal }) =>
      unwrap(
        api.GET("/v1/jobs", {
          params: { query: { status: f.status ? [f.status.join(",")] : undefined, name: f.name, queue: f.queue, after: f.after, limit: f.limit ?? 50 } },
          signal,
        }),
      ),
    refetchInterval: opts.live ? LIVE_REFRESH_MS : false,
    placeholderData: (previous) => previous,
  });
}

export function jobDetailQuery(id: string) {
  return queryOptions({
    queryKey: jobKeys.detail(id),
    queryFn: ({ signal }) => unwrap(api.GET("/v1/jobs/{job_id}", { params: { path: { job_id: id } }, signal })),
    refetchInterval: (q) => (q.state.data && isTerminal(q.state.data.status) ? false : LIVE_REFRESH_MS),
  });
}

export function jobEventsQuery(id: string) {
  return queryOptions({
    queryKey: jobKeys.events(id),
    queryFn: ({ signal }) =>
      unwrap(api.GET("/v1/jobs/{job_id}/events", { params: { path: { job_id: id } }, signal })).then((p) => p.data),
  });
}

export function jobMetricsQuery(id: string) {
  return queryOptions({
    queryKey: jobKeys.metrics(id),
    queryFn: ({ signal }): Promise<Series> =>
      unwrap(api.GET("/v1/jobs/{job_id}/metrics", { params: { path: { job_id: id } }, signal })).then((m) => m.series),
    staleTime: Infinity, // kept current by the stream
  });
}

/** Log lines held in the page, oldest first, by id. */
export interface LogBuffer {
  lines: LogLine[];
  /** true when the first fetch stopped at MAX_LOG_LINES: the view is not the whole log. */
  truncated: boolean;
}

export const LOG_PAGE = 2_000;
export const MAX_LOG_LINES = 20_000;

/** Whether the id-sorted `lines` holds a line with this id (binary search). */
function hasLineId(lines: readonly LogLine[], id: number): boolean {
  let lo = 0;
  let hi = lines.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const v = (lines[mid] as LogLine).id;
    if (v === id) return true;
    if (v < id) lo = mid + 1;
    else hi = mid - 1;
  }
  return false;
}

/**
 * Merge log lines into an id-sorted list, once each (the stream replays lines that the first fetch
 * already returned). Returns `current` itself when nothing is new.
 */
export function mergeLogLines(current: readonly LogLine[], incoming: readonly LogLine[]): LogLine[] {
  const lastId = current.length ? (current[current.length - 1] as LogLine).id : -Infinity;
  const fresh = new Map<number, LogLine>();
  let inside = false;
  for (const l of incoming) {
    if (l.id > lastId) fresh.set(l.id, l);
    else if (!hasLineId(current, l.id)) {
      fresh.set(l.id, l);
      inside = true;
    }
  }
  if (!fresh.size) return current as LogLine[];
  const added = [...fresh.values()].sort((a, b) => a.id - b.id);
  return inside ? [...current, ...added].sort((a, b) => a.id - b.id) : [...current, ...added];
}

export function jobLogsQuery(id: string) {
  return queryOptions({
    queryKey: jobKeys.logs(id),
    queryFn: async ({ signal }): Promise<LogBuffer> => {
      let lines: LogLine[] = [];
      let after = 0;
      for (;;) {
        const page = await unwrap(
          api.GET("/v1/jobs/{job_id}/logs", { params: { path: { job_id: id }, query: { after, limit: LOG_PAGE } }, signal }),
        );
        lines = mergeLogLines(lines, page.data);
        if (page.data.length < LOG_PAGE) return { lines, truncated: false };
        if (lines.length >= MAX_LOG_LINES) return { lines, truncated: true };
        after = page.next_after;
      }
    },
    staleTime: Infinity, // kept current by the stream
  });
}

export function jobCheckpointsQuery(id: string, live: boolean) {
  return queryOptions({
    queryKey: jobKeys.checkpoints(id),
    queryFn: ({ signal }) =>
      unwrap(api.GET("/v1/jobs/{job_id}/checkpoints", { params: { path: { job_id: id } }, signal })).then((p) => p.data),
    refetchInterval: live ? 10_000 : false,
  });
}

export function jobRolloutsQuery(id: string, live: boolean) {
  return queryOptions({
    queryKey: jobKeys.rollouts(id),
    queryFn: ({ signal }) =>
      unwrap(api.GET("/v1/jobs/{job_id}/rollouts", { params: { path: { job_id: id } }, signal })).then((p) => p.data),
    refetchInterval: live ? 10_000 : false,
  });
}

export function useCancelJob() {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: (id: string) => unwrap(api.POST("/v1/jobs/{job_id}/cancel", { params: { path: { job_id: id } } })),
    onSuccess: (job) => {
      qc.setQueryData(jobKeys.detail(job.id), (old) => (old ? { ...old, ...job } : old));
      void qc.invalidateQueries({ queryKey: jobKeys.detail(job.id) });
      void qc.invalidateQueries({ queryKey: jobKeys.lists() });
    },
  });
}

export function useSubmitJob() {
  const qc = useQueryClient();
  return useMutation({
    mutationFn: ({ body, idempotencyKey }: { body: JobCreate; idempotencyKey: string }) =>
      unwrap(api.POST("/v1/jobs", { body, headers: { "Idempotency-Key": idempotencyKey } })),
    onSuccess: (job) => {
      qc.setQueryData(jobKeys.detail(job.id), job);
      void qc.invalidateQueries({ queryKey: jobKeys.lists() });
    },
  });
}
