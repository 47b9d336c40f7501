// How the dashboard writes times, durations, sizes and numbers. Pure functions: unit-tested.
import { TERMINAL_STATUSES } from "../api/types";

/**
 * Parse an API timestamp. The API stores UTC; a value without a zone designator (SQLite returns
 * naive datetimes) is read as UTC, not as the browser's local time.
 */
export function parseTime(value: string | null | undefined): Date | null {
  if (!value) return null;
  const hasZone = /(Z|[+-]\d\d:?\d\d)$/i.test(value);
  const d = new Date(hasZone ? value : `${value}Z`);
  return Number.isNaN(d.getTime()) ? null : d;
}

const pad = (n: number, w = 2) => String(n).padStart(w, "0");

/** "2026-11-29 10:26:05" in the browser's time zone. */
export function formatTime(value: string | Date | null | undefined): string {
  const d = value instanceof Date ? value : parseTime(value);
  if (!d) return "—";
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

/** "10:26:05.123": for log lines and metric tooltips. */
export function formatClock(value: string | Date | null | undefined, millis = false): string {
  const d = value instanceof Date ? value : parseTime(value);
  if (!d) return "—";
  const base = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return millis ? `${base}.${pad(d.getMilliseconds(), 3)}` : base;
}

/** A duration in ms as the two largest units: "850ms", "42s", "3m 07s", "2h 05m", "3d 04h". */
export function formatDuration(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return "—";
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${pad(s % 60)}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h}h ${pad(m % 60)}m`;
  return `${Math.floor(h / 24)}d ${pad(h % 24)}h`;
}

/** "just now", "42s ago", "3m ago", "2h ago", "5d ago" (or "in 3m" for the future). */
export function formatRelative(value: string | Date | null | undefined, now: number = Date.now()): string {
  const d = value instanceof Date ? value : parseTime(value);
  if (!d) return "—";
  const diff = now - d.getTime();
  const abs = Math.abs(diff);
  if (abs < 5_000) return "just now";
  const s = Math.floor(abs / 1000);
  const text =
    s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m` : s < 86400 ? `${Math.floor(s / 3600)}h` : `${Math.floor(s / 86400)}d`;
  return diff >= 0 ? `${text} ago` : `in ${text}`;
}

/** Bytes in binary units: "0 B", "512 B", "1.5 KiB", "3.20 GiB". */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = Math.abs(bytes);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const sign = bytes < 0 ? "-" : "";
  if (i === 0) return `${sign}${v} B`;
  return `${sign}${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${units[i]}`;
}

/**
 * A metric value, compact but exact enough to compare runs: 4 significant digits, exponent form
 * for very small or very large magnitudes ("0.6125", "1.235e-5", "3.2e+7", "1200").
 */
export function formatMetric(value: number | null | undefined): string {
  if (value == null) return "—";
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "∞" : "-∞";
  if (value === 0) return "0";
  const abs = Math.abs(value);
  if (abs >= 1e6 || abs < 1e-3) return value.toExponential(3).replace(/\.?0+e/, "e");
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(4)));
}

export interface JobTimes {
  status: string;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
}

/** `JobStatus.is_terminal()` (wire/jobs.py): the status is one of the generated `TerminalJobStatus`. */
export function isTerminal(status: string): boolean {
  return (TERMINAL_STATUSES as readonly string[]).includes(status);
}

/** How long the job has run (start to finish, or to `now` while it runs); null before it starts. */
export function runDuration(job: JobTimes, now: number = Date.now()): number | null {
  const start = parseTime(job.started_at);
  if (!start) return null;
  const end = parseTime(job.finished_at);
  return (end ? end.getTime() : isTerminal(job.status) ? start.getTime() : now) - start.getTime();
}

/** How long the job waited, or has waited so far, before it started. */
export function waitDuration(job: JobTimes, now: number = Date.now()): number | null {
  const created = parseTime(job.created_at);
  if (!created) return null;
  const start = parseTime(job.started_at) ?? parseTime(job.finished_at);
  if (start) return start.getTime() - created.getTime();
  return isTerminal(job.status) ? null : now - created.getTime();
}

/** What a pool's slots are: GPUs, or CPU slots where the pool's accelerator is "cpu" (the embedded platform on a
 * machine without GPUs). An unknown pool (not loaded yet) counts as GPUs. */
export function slotNoun(accelerator: string | null | undefined, count = 2): string {
  const cpu = accelerator === "cpu";
  if (count === 1) return cpu ? "CPU slot" : "GPU";
  return cpu ? "CPU slots" : "GPUs";
}

/** "1 GPU", "8 GPUs", "1 CPU slot", "2 CPU slots". */
export function formatSlots(count: number, accelerator: string | null | undefined): string {
  return `${count} ${slotNoun(accelerator, count)}`;
}

/** A column of several pools' slots: "GPUs" or "CPU slots" when all are alike, else "Slots". */
export function slotsHeading(accelerators: readonly (string | null | undefined)[]): string {
  const kinds = new Set(accelerators.map((a) => (a === "cpu" ? "cpu" : "gpu")));
  if (kinds.size === 1) return kinds.has("cpu") ? "CPU slots" : "GPUs";
  return kinds.size === 0 ? "GPUs" : "Slots";
}

/** "12 / 250 (4.8%)", or "12" when the total is unknown. */
export function formatProgress(step: number | null | undefined, total: number | null | undefined): string {
  if (step == null && total == null) return "—";
  const s = step ?? 0;
  if (!total) return String(s);
  return `${s} / ${total} (${((100 * s) / total).toFixed(1)}%)`;
}

/** What each failure category (scheduler.domain.jobs.FailureReason) means, for people. */
export const FAILURE_CATEGORIES: Record<string, string> = {
  setup: "could not launch on Ray",
  user_code: "the pipeline or a user hook raised",
  no_resource: "the demand can never fit the pool",
  controller: "the Ray job vanished or was stopped outside the platform",
  lost: "the node or the driver's heartbeat was lost",
};

/** "user_code — the pipeline or a user hook raised"; unknown categories as they are. */
export function describeFailure(category: string | null | undefined): string {
  if (!category) return "";
  const text = FAILURE_CATEGORIES[category];
  return text ? `${category} — ${text}` : category;
}
