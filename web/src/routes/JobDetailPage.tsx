// A job's page: header, actions and the tabs (metrics, events, logs, checkpoints, rollouts, spec),
// kept live by the job's SSE stream until it ends.
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { ApiError } from "../api/client";
import { jobCheckpointsQuery, jobDetailQuery, jobEventsQuery, jobLogsQuery, jobMetricsQuery, jobRolloutsQuery, useCancelJob } from "../api/jobs";
import { useJobStream } from "../api/stream";
import { ConfirmDialog } from "../components/common/ConfirmDialog";
import { ErrorPanel } from "../components/common/ErrorPanel";
import { Loading } from "../components/common/Loading";
import { StatusBadge } from "../components/common/StatusBadge";
import { type TabDef, Tabs } from "../components/common/Tabs";
import { CheckpointsTab } from "../components/jobs/CheckpointsTab";
import { EventsTab } from "../components/jobs/EventsTab";
import { JobHeader } from "../components/jobs/JobHeader";
import { LogsTab } from "../components/jobs/LogsTab";
import { MetricsTab } from "../components/jobs/MetricsTab";
import { RolloutsTab } from "../components/jobs/RolloutsTab";
import { SpecTab } from "../components/jobs/SpecTab";
import { isTerminal } from "../lib/format";
import { buildHash, navigate } from "../lib/router";

export const JOB_TABS = ["metrics", "events", "logs", "checkpoints", "rollouts", "spec"] as const;
type JobTab = (typeof JOB_TABS)[number];

const STREAM_LABEL = { idle: "", connecting: "connecting…", live: "live", reconnecting: "reconnecting…", ended: "", failed: "stream unavailable" };

export function JobDetailPage({ jobId, tab }: { jobId: string; tab: string | undefined }) {
  const current: JobTab = (JOB_TABS as readonly string[]).includes(tab ?? "") ? (tab as JobTab) : "metrics";
  const detail = useQuery(jobDetailQuery(jobId));
  const terminal = detail.data ? isTerminal(detail.data.status) : false;
  const running = !!detail.data && !terminal;
  // The stream writes into these caches: keep them loaded whichever tab is open.
  const events = useQuery({ ...jobEventsQuery(jobId), enabled: detail.isSuccess });
  const metrics = useQuery({ ...jobMetricsQuery(jobId), enabled: detail.isSuccess });
  const logs = useQuery({ ...jobLogsQuery(jobId), enabled: detail.isSuccess });
  const checkpoints = useQuery({ ...jobCheckpointsQuery(jobId, running), enabled: detail.isSuccess });
  const rollouts = useQuery({ ...jobRolloutsQuery(jobId, running), enabled: detail.isSuccess });
  const stream = useJobStream(jobId, detail.isSuccess && !terminal);
  const cancel = useCancelJob();
  const [confirming, setConfirming] = useState(false);

  if (detail.isPending) return <Loading label="Loading job…" />;
  if (detail.isError) {
    const notFound = detail.error instanceof ApiError && detail.error.status === 404;
    return (
      <div>
        <p>
          <a href="#/jobs">← Jobs</a>
        </p>
        <ErrorPanel error={detail.error} title={notFound ? `No job ${jobId}` : undefined} />
      </div>
    );
  }
  const job = detail.data;
  const cancellable = !terminal && job.status !== "CANCELLING";
  const tabs: TabDef[] = [
    { id: "metrics", label: "Metrics", count: metrics.data ? Object.keys(metrics.data).length : null },
    { id: "events", label: "Events", count: events.data?.length ?? null },
    { id: "logs", label: "Logs", count: logs.data?.lines.length ?? null },
    { id: "checkpoints", label: "Checkpoints", count: checkpoints.data?.length ?? null },
    { id: "rollouts", label: "Rollouts", count: rollouts.data?.length ?? null },
    { id: "spec", label: "Spec" },
  ];

  return (
    <div>
      <p style={{ margin: "0 0 8px" }}>
        <a href="#/jobs">← Jobs</a>
      </p>
      <div className="page-head">
        <h1>{job.name}</h1>
        <StatusBadge status={job.status} />
        {STREAM_LABEL[stream] ? (
          <span className="live" data-state={stream} aria-live="polite">
            {STREAM_LABEL[stream]}
          </span>
        ) : null}
        <code className="muted">{job.id}</code>
        <span className="spacer" />
        <button type="button" onClick={() => navigate(buildHash(["submit"], { from: job.id }))}>
          Resubmit…
        </button>
        {cancellable ? (
          <button type="button" className="danger" onClick={() => setConfirming(true)}>
            Cancel job
          </button>
        ) : null}
      </div>
      {cancel.isError ? <ErrorPanel error={cancel.error} title="Cancel failed" /> : null}
      <JobHeader job={job} />
      <Tabs
        label="Job views"
        idPrefix="job"
        tabs={tabs}
        current={current}
        onSelect={(t) => navigate(buildHash(["jobs", job.id, t]), { replace: true })}
      />
      <section id="job-panel" role="tabpanel" aria-labelledby={`job-tab-${current}`}>
        {current === "metrics" ? <MetricsTab jobId={job.id} running={running} /> : null}
        {current === "events" ? <EventsTab jobId={job.id} /> : null}
        {current === "logs" ? <LogsTab jobId={job.id} running={running} /> : null}
        {current === "checkpoints" ? <CheckpointsTab jobId={job.id} outputDir={job.output_dir} running={running} /> : null}
        {current === "rollouts" ? <RolloutsTab jobId={job.id} outputDir={job.output_dir} running={running} /> : null}
        {current === "spec" ? <SpecTab job={job} /> : null}
      </section>
      <ConfirmDialog
        open={confirming}
        title={`Cancel ${job.name}?`}
        confirmLabel="Cancel job"
        busy={cancel.isPending}
        onClose={() => setConfirming(false)}
        onConfirm={() =>
          cancel.mutate(job.id, {
            onSettled: () => setConfirming(false),
          })
        }
      >
        <p>
          The job <code>{job.id}</code> stops{job.status === "RUNNING" ? " after its driver acknowledges the request" : ""}. Checkpoints
          already saved stay in its output directory. This cannot be undone.
        </p>
      </ConfirmDialog>
    </div>
  );
}
