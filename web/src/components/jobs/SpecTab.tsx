// Spec tab: what was submitted, the normalized spec (every Relax parameter, derived defaults
// applied) and the resource demand the scheduler placed.
import { useMemo, useState } from "react";
import { usePoolAccelerators } from "../../api/platform";
import type { JobDetail, SpecIssue } from "../../api/types";
import { IssueList } from "../common/ErrorPanel";
import { JsonBlock } from "../common/JsonBlock";
import { SearchField } from "../common/SearchField";
import { DemandView } from "./DemandView";

type Show = "set" | "nonempty" | "all";

const key = (k: string) => k.replace(/-/g, "_");

export function SpecTab({ job }: { job: JobDetail }) {
  const accelerator = usePoolAccelerators().get(job.pool);
  const [filter, setFilter] = useState("");
  const [show, setShow] = useState<Show>("set");
  const submittedSpec = (job.submitted.spec ?? {}) as Record<string, unknown>;
  const submittedKeys = useMemo(() => {
    const keys = new Set(Object.keys(submittedSpec).map(key));
    // Flags submissions: every --flag named in args counts as set.
    if (Array.isArray(job.submitted.args)) {
      for (const a of job.submitted.args as string[]) if (a.startsWith("--")) keys.add(key(a.slice(2).split("=")[0] ?? ""));
    }
    return keys;
  }, [submittedSpec, job.submitted.args]);
  const derivedKeys = useMemo(() => new Set(Object.keys((job.submitted.derived ?? {}) as object).map(key)), [job.submitted.derived]);
  const warnings = (Array.isArray(job.submitted.warnings) ? job.submitted.warnings : []) as SpecIssue[];

  const entries = useMemo(() => {
    const f = key(filter.trim().toLowerCase());
    return Object.entries(job.spec)
      .filter(([k, v]) => {
        if (f && !k.includes(f)) return false;
        if (show === "set") return submittedKeys.has(k) || derivedKeys.has(k);
        if (show === "nonempty") return v !== null && v !== false && !(Array.isArray(v) && !v.length);
        return true;
      })
      .sort(([a], [b]) => a.localeCompare(b));
  }, [job.spec, filter, show, submittedKeys, derivedKeys]);

  return (
    <div className="grid-2">
      <div className="panel">
        <div className="row" style={{ justifyContent: "space-between" }}>
          <h3>Normalized spec</h3>
          <span className="muted small">
            {entries.length} of {Object.keys(job.spec).length} parameters
          </span>
        </div>
        <div className="toolbar">
          <SearchField label="Find parameter" value={filter} onChange={setFilter} placeholder="e.g. rollout-batch-size" />
          <label className="field">
            Show
            <select value={show} onChange={(e) => setShow(e.target.value as Show)}>
              <option value="set">submitted and derived</option>
              <option value="nonempty">all but null / false / empty</option>
              <option value="all">all parameters</option>
            </select>
          </label>
        </div>
        <div className="table-wrap" style={{ maxHeight: 640, overflow: "auto" }}>
          <table className="kv-table">
            <caption className="sr-only">Normalized spec</caption>
            <tbody>
              {entries.map(([k, v]) => (
                <tr key={k}>
                  <td>
                    {k.replace(/_/g, "-")}
                    {submittedKeys.has(k) ? <span className="tag">submitted</span> : derivedKeys.has(k) ? <span className="tag derived">derived</span> : null}
                  </td>
                  <td className="mono" style={{ overflowWrap: "anywhere" }}>
                    {typeof v === "string" ? v : JSON.stringify(v)}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </div>
      <div>
        {warnings.length ? (
          <div className="warn-panel" style={{ marginBottom: 14 }}>
            <strong>Warnings at submission</strong>
            <IssueList issues={warnings} />
          </div>
        ) : null}
        <div className="panel">
          <h3>Resource demand</h3>
          <DemandView demand={job.demand} accelerator={accelerator} />
        </div>
        <div className="panel">
          <JsonBlock label="Submitted" value={job.submitted} />
        </div>
        <div className="panel">
          <JsonBlock label="Normalized spec (JSON)" value={job.spec} />
        </div>
      </div>
    </div>
  );
}
