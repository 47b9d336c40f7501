// Metrics tab: one chart per metric, grouped by the Relax prefixes, filterable, with smoothing.
import { useQuery } from "@tanstack/react-query";
import { useMemo, useState } from "react";
import { jobMetricsQuery } from "../../api/jobs";
import { groupMetricNames } from "../../lib/metrics";
import { ErrorPanel } from "../common/ErrorPanel";
import { Loading } from "../common/Loading";
import { SearchField } from "../common/SearchField";
import { MetricChart } from "./MetricChart";

const SMOOTHING = [
  { value: 0, label: "none" },
  { value: 0.6, label: "0.6" },
  { value: 0.8, label: "0.8" },
  { value: 0.95, label: "0.95" },
];

export function MetricsTab({ jobId, running }: { jobId: string; running: boolean }) {
  const q = useQuery(jobMetricsQuery(jobId));
  const [filter, setFilter] = useState("");
  const [smoothing, setSmoothing] = useState(0);
  const groups = useMemo(() => {
    const f = filter.trim().toLowerCase();
    const names = Object.keys(q.data ?? {}).filter((n) => !f || n.toLowerCase().includes(f));
    return groupMetricNames(names);
  }, [q.data, filter]);

  if (q.isPending) return <Loading label="Loading metrics…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  const total = Object.keys(q.data).length;
  return (
    <div>
      <div className="toolbar">
        <SearchField label="Filter metrics" value={filter} onChange={setFilter} placeholder="e.g. reward, loss, eval/" />
        <label className="field">
          Smoothing (EMA)
          <select value={smoothing} onChange={(e) => setSmoothing(Number(e.target.value))}>
            {SMOOTHING.map((s) => (
              <option key={s.value} value={s.value}>
                {s.label}
              </option>
            ))}
          </select>
        </label>
        <span className="spacer" />
        <span className="muted small">
          {total} metrics{running ? " · live" : ""}
        </span>
      </div>
      {total === 0 ? (
        <div className="panel table-empty">
          {running ? "No metrics reported yet: they appear here as the job reports them." : "This job reported no metrics."}
        </div>
      ) : groups.length === 0 ? (
        <div className="panel table-empty">No metric matches “{filter}”.</div>
      ) : (
        groups.map((g) => (
          <details key={g.group} className="metric-group" open>
            <summary>
              {g.group}/ <span className="muted small">({g.names.length})</span>
            </summary>
            <div className="charts">
              {g.names.map((n) => (
                <MetricChart key={n} name={n} points={q.data[n] ?? []} smoothing={smoothing} />
              ))}
            </div>
          </details>
        ))
      )}
    </div>
  );
}
