// The jobs table: one row per job with what an operator scans for (status, where, how far, why).
import type { Job } from "../../api/types";
import { usePoolAccelerators } from "../../api/platform";
import { formatDuration, formatProgress, formatRelative, formatSlots, formatTime, isTerminal, runDuration, slotsHeading, waitDuration } from "../../lib/format";
import { buildHash } from "../../lib/router";
import { Bar } from "../common/Bar";
import { StatusBadge } from "../common/StatusBadge";

/** "Why" column: the wait reason while queued (with the queue position), the status reason otherwise. */
export function whyText(job: Job): string {
  if (job.status === "QUEUED") {
    const pos = job.queue_position != null ? `#${job.queue_position} · ` : "";
    return `${pos}${job.wait_reason ?? job.status_reason ?? "waiting for a scheduling pass"}`;
  }
  if (job.status === "FAILED" && job.failure_reason) {
    return job.status_reason ? `${job.failure_reason}: ${job.status_reason}` : job.failure_reason;
  }
  return job.status_reason ?? "";
}

export function JobsTable({ jobs, now }: { jobs: readonly Job[]; now: number }) {
  const accelerators = usePoolAccelerators();
  return (
    <div className="table-wrap">
      <table data-testid="jobs-table">
        <caption className="sr-only">Jobs, newest first</caption>
        <thead>
          <tr>
            <th scope="col">Job</th>
            <th scope="col">Status</th>
            <th scope="col">Queue / pool</th>
            <th scope="col" className="num">{slotsHeading(jobs.map((j) => accelerators.get(j.pool)))}</th>
            <th scope="col">Progress</th>
            <th scope="col">Created</th>
            <th scope="col" className="num">Duration</th>
            <th scope="col">Why</th>
          </tr>
        </thead>
        <tbody>
          {jobs.map((j) => {
            const run = runDuration(j, now);
            const wait = waitDuration(j, now);
            const why = whyText(j);
            return (
              <tr key={j.id} data-job-id={j.id}>
                <td>
                  <a className="job-link" href={buildHash(["jobs", j.id])}>
                    {j.name}
                  </a>
                  <div className="mono muted small">{j.id}</div>
                </td>
                <td>
                  <StatusBadge status={j.status} />
                  {j.attempt > 1 ? <div className="muted small">attempt {j.attempt}</div> : null}
                </td>
                <td className="nowrap">
                  {j.queue}
                  <div className="muted small">{j.pool}</div>
                </td>
                <td className="num nowrap">{formatSlots(j.total_gpus, accelerators.get(j.pool))}</td>
                <td>
                  <div className="progress-cell">
                    <span className="small">{formatProgress(j.progress_step, j.total_steps)}</span>
                    {j.total_steps ? <Bar value={j.progress_step ?? 0} max={j.total_steps} label={`progress of ${j.name}`} /> : null}
                  </div>
                </td>
                <td className="nowrap" title={formatTime(j.created_at)}>
                  {formatRelative(j.created_at, now)}
                </td>
                <td className="num nowrap" title={wait != null ? `waited ${formatDuration(wait)}` : undefined}>
                  {run != null ? (
                    formatDuration(run)
                  ) : !isTerminal(j.status) && wait != null ? (
                    <span className="muted">waiting {formatDuration(wait)}</span>
                  ) : (
                    <span className="muted">never ran</span>
                  )}
                </td>
                <td className="small" style={{ maxWidth: 380, overflowWrap: "anywhere" }}>
                  {why ? <span className={j.status === "FAILED" ? "" : "muted"}>{why.length > 240 ? `${why.slice(0, 240)}…` : why}</span> : null}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}
