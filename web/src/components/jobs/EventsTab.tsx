// Events tab: the job's transitions and driver events as a timeline, with the time spent in each state.
import { useQuery } from "@tanstack/react-query";
import { jobEventsQuery } from "../../api/jobs";
import { formatDuration, formatTime, parseTime } from "../../lib/format";
import { ErrorPanel } from "../common/ErrorPanel";
import { Loading } from "../common/Loading";
import { StatusBadge } from "../common/StatusBadge";

export function EventsTab({ jobId }: { jobId: string }) {
  const q = useQuery(jobEventsQuery(jobId));
  if (q.isPending) return <Loading label="Loading events…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  if (!q.data.length) return <div className="panel table-empty">No events yet.</div>;
  const first = parseTime(q.data[0]?.time)?.getTime() ?? 0;
  return (
    <ol className="timeline" aria-label="Job events" data-testid="events">
      {q.data.map((e, i) => {
        const t = parseTime(e.time)?.getTime() ?? 0;
        const next = q.data[i + 1];
        const until = next ? (parseTime(next.time)?.getTime() ?? t) - t : null;
        return (
          <li key={e.id}>
            <div className="row">
              {e.to_status ? (
                <>
                  {e.from_status ? <StatusBadge status={e.from_status} /> : null}
                  {e.from_status ? <span aria-label="to">→</span> : null}
                  <StatusBadge status={e.to_status} />
                </>
              ) : (
                <strong>{e.kind}</strong>
              )}
              {e.to_status && e.kind !== "transition" ? <span className="muted small">{e.kind}</span> : null}
            </div>
            <div className="when">
              {formatTime(e.time)} · +{formatDuration(t - first)}
              {until != null && e.to_status ? ` · ${formatDuration(until)} in ${e.to_status}` : ""}
            </div>
            {e.reason ? <div className="reason">{e.reason}</div> : null}
          </li>
        );
      })}
    </ol>
  );
}
