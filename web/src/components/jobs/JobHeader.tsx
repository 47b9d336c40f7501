// The top of a job's page: status and why, progress, timing, placement, and the actions.
import { usePoolAccelerators } from "../../api/platform";
import type { JobDetail } from "../../api/types";
import { describeFailure, formatDuration, formatProgress, formatRelative, formatTime, isTerminal, parseTime, runDuration, slotNoun, waitDuration } from "../../lib/format";
import { Bar } from "../common/Bar";
import { DataTable } from "../common/DataTable";
import { StatusBadge } from "../common/StatusBadge";
import { useNow } from "../common/useNow";

/** A running job whose driver has not reported for this long is probably stuck or gone. */
const STALE_REPORT_MS = 120_000;

export function JobHeader({ job }: { job: JobDetail }) {
  const now = useNow();
  const accelerator = usePoolAccelerators().get(job.pool);
  const lastReport = parseTime(job.last_report_at);
  const stale = job.status === "RUNNING" && lastReport != null && now - lastReport.getTime() > STALE_REPORT_MS;
  const waited = waitDuration(job, now);
  return (
    <div>
      {job.status === "FAILED" ? (
        <div className="error-panel" role="status" style={{ marginBottom: 12 }}>
          <h3 data-testid="failure-reason">Failed{job.failure_reason ? `: ${describeFailure(job.failure_reason)}` : ""}</h3>
          {job.status_reason ? <div style={{ whiteSpace: "pre-wrap", overflowWrap: "anywhere" }}>{job.status_reason}</div> : null}
          <div className="small muted" style={{ marginTop: 4 }}>
            The Logs tab has the driver’s last lines; the Events tab, every transition.
          </div>
        </div>
      ) : null}
      {job.status === "QUEUED" ? (
        <div className="warn-panel" role="status" style={{ marginBottom: 12 }} data-testid="wait-reason">
          <strong>Waiting</strong>
          {job.queue_position != null ? ` · position ${job.queue_position} in queue ${job.queue}` : ""}
          {waited != null ? ` · for ${formatDuration(waited)}` : ""}
          <div>{job.wait_reason ?? job.status_reason ?? "waiting for the next scheduling pass"}</div>
        </div>
      ) : null}
      {stale ? (
        <div className="warn-panel" role="status" style={{ marginBottom: 12 }}>
          No report from the driver for {formatDuration(now - (lastReport as Date).getTime())}: the job may be stuck.
        </div>
      ) : null}
      <div className="panel">
        <dl className="facts">
          <div>
            <dt>Status</dt>
            <dd>
              <StatusBadge status={job.status} />
            </dd>
          </div>
          {job.status_reason && job.status !== "QUEUED" && job.status !== "FAILED" ? (
            <div style={{ gridColumn: "span 2" }}>
              <dt>Reason</dt>
              <dd data-testid="status-reason">{job.status_reason}</dd>
            </div>
          ) : null}
          <div>
            <dt>Attempt</dt>
            <dd>{job.attempt}</dd>
          </div>
          <div>
            <dt>Progress</dt>
            <dd>
              <div className="progress-cell">
                <span>{formatProgress(job.progress_step, job.total_steps)}</span>
                {job.total_steps ? <Bar value={job.progress_step ?? 0} max={job.total_steps} label="progress" /> : null}
              </div>
            </dd>
          </div>
          <div>
            <dt>Queue / pool</dt>
            <dd>
              {job.queue} / {job.pool}
            </dd>
          </div>
          <div>
            <dt>Priority</dt>
            <dd>{job.priority_class} ({job.priority}{job.preemptible ? "" : ", not preemptible"})</dd>
          </div>
          <div>
            <dt>{slotNoun(accelerator)}</dt>
            <dd>{job.total_gpus}</dd>
          </div>
          <div>
            <dt>Created</dt>
            <dd title={job.created_at}>{formatTime(job.created_at)}</dd>
          </div>
          <div>
            <dt>Waited</dt>
            <dd>{formatDuration(waited)}</dd>
          </div>
          <div>
            <dt>Started</dt>
            <dd>{formatTime(job.started_at)}</dd>
          </div>
          <div>
            <dt>{isTerminal(job.status) ? "Finished" : "Running for"}</dt>
            <dd>{isTerminal(job.status) ? formatTime(job.finished_at) : formatDuration(runDuration(job, now))}</dd>
          </div>
          {isTerminal(job.status) ? (
            <div>
              <dt>Ran for</dt>
              <dd>{formatDuration(runDuration(job, now))}</dd>
            </div>
          ) : null}
          <div>
            <dt>Last report</dt>
            <dd title={job.last_report_at ?? undefined}>{lastReport ? formatRelative(lastReport, now) : "—"}</dd>
          </div>
          <div style={{ gridColumn: "span 2" }}>
            <dt>Output directory</dt>
            <dd className="mono">{job.output_dir}</dd>
          </div>
          {job.ray_submission_id ? (
            <div>
              <dt>Ray submission</dt>
              <dd className="mono">{job.ray_submission_id}</dd>
            </div>
          ) : null}
          {Object.keys(job.labels).length ? (
            <div>
              <dt>Labels</dt>
              <dd className="mono">
                {Object.entries(job.labels)
                  .map(([k, v]) => `${k}=${v}`)
                  .join(", ")}
              </dd>
            </div>
          ) : null}
        </dl>
        {(job.allocations ?? []).length ? (
          <DataTable
            style={{ marginTop: 12 }}
            caption="Allocation"
            captionStyle={{ textAlign: "left", fontWeight: 600, paddingBottom: 4 }}
            head={
              <>
                <th scope="col">Pool</th>
                <th scope="col">Node</th>
                <th scope="col">Role</th>
                <th scope="col" className="num">{slotNoun(accelerator)}</th>
              </>
            }
          >
            {(job.allocations ?? []).map((a, i) => (
              <tr key={i}>
                <td>{a.pool}</td>
                <td>{a.node}</td>
                <td>{a.releasing ? `${a.role} (engine stopping)` : a.role}</td>
                <td className="num">{a.gpus}</td>
              </tr>
            ))}
          </DataTable>
        ) : null}
      </div>
    </div>
  );
}
