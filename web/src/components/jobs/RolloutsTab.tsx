// Rollouts tab: the rollout records the job wrote (train and eval), with a preview of the samples.
import { useQuery } from "@tanstack/react-query";
import { Fragment, useState } from "react";
import { artifactPath, downloadArtifact, previewJsonl } from "../../api/artifacts";
import { jobRolloutsQuery } from "../../api/jobs";
import type { Rollout } from "../../api/types";
import { formatTime } from "../../lib/format";
import { ErrorPanel } from "../common/ErrorPanel";
import { Loading } from "../common/Loading";

/** The fields a reader looks for first in a rollout sample; the rest stays in the JSON. */
const SAMPLE_FIELDS = ["prompt", "response", "label", "reward"] as const;

function cell(v: unknown): string {
  if (v == null) return "";
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

function Preview({ jobId, rel }: { jobId: string; rel: string }) {
  const q = useQuery({ queryKey: ["artifact-preview", jobId, rel], queryFn: ({ signal }) => previewJsonl(jobId, rel, 20, signal), staleTime: Infinity });
  if (q.isPending) return <Loading label="Loading samples…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  const records = q.data as Array<Record<string, unknown>>;
  const known = SAMPLE_FIELDS.filter((f) => records.some((r) => r && typeof r === "object" && f in r));
  if (!known.length) return <pre className="block">{records.map((r) => JSON.stringify(r)).join("\n")}</pre>;
  return (
    <table>
      <caption className="sr-only">First samples</caption>
      <thead>
        <tr>
          {known.map((f) => (
            <th key={f} scope="col">
              {f}
            </th>
          ))}
        </tr>
      </thead>
      <tbody>
        {records.map((r, i) => (
          <tr key={i}>
            {known.map((f) => (
              <td key={f} className={f === "reward" ? "num" : "mono"} style={{ whiteSpace: "pre-wrap", overflowWrap: "anywhere", maxWidth: 520 }}>
                {cell(r[f])}
              </td>
            ))}
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function RolloutsTab({ jobId, outputDir, running }: { jobId: string; outputDir: string; running: boolean }) {
  const q = useQuery(jobRolloutsQuery(jobId, running));
  const [open, setOpen] = useState<number | null>(null);
  const [split, setSplit] = useState<string>("all");
  const [failure, setFailure] = useState<unknown>(null);
  if (q.isPending) return <Loading label="Loading rollouts…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  if (!q.data.length) return <div className="panel table-empty">No rollout records yet.</div>;
  const splits = [...new Set(q.data.map((r) => r.split))].sort();
  const rows: Rollout[] = q.data.filter((r) => split === "all" || r.split === split).sort((a, b) => b.rollout_id - a.rollout_id || b.id - a.id);
  return (
    <div>
      <div className="toolbar">
        <label className="field">
          Split
          <select value={split} onChange={(e) => setSplit(e.target.value)}>
            <option value="all">all</option>
            {splits.map((s) => (
              <option key={s}>{s}</option>
            ))}
          </select>
        </label>
        <span className="spacer" />
        <span className="muted small">{rows.length} records</span>
      </div>
      <ErrorPanel error={failure} />
      <div className="panel table-wrap">
        <table>
          <caption className="sr-only">Rollout records</caption>
          <thead>
            <tr>
              <th scope="col" className="num">Rollout</th>
              <th scope="col">Split</th>
              <th scope="col" className="num">Samples</th>
              <th scope="col">Path (in the output directory)</th>
              <th scope="col" className="num">Attempt</th>
              <th scope="col">Written</th>
              <th scope="col">
                <span className="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => {
              const rel = artifactPath(outputDir, r.path);
              return (
                <Fragment key={r.id}>
                  <tr>
                    <td className="num">{r.rollout_id}</td>
                    <td>{r.split}</td>
                    <td className="num">{r.num_samples}</td>
                    <td className="mono" style={{ overflowWrap: "anywhere" }} title={r.path}>
                      {rel ?? r.path}
                    </td>
                    <td className="num">{r.attempt}</td>
                    <td className="nowrap">{formatTime(r.time)}</td>
                    <td className="nowrap">
                      {rel ? (
                        <span className="row">
                          <button type="button" aria-expanded={open === r.id} onClick={() => setOpen(open === r.id ? null : r.id)}>
                            {open === r.id ? "Hide" : "Samples"}
                          </button>
                          <button
                            type="button"
                            onClick={() => {
                              setFailure(null);
                              downloadArtifact(jobId, rel).catch(setFailure);
                            }}
                          >
                            Download
                          </button>
                        </span>
                      ) : null}
                    </td>
                  </tr>
                  {open === r.id && rel ? (
                    <tr>
                      <td colSpan={7}>
                        <Preview jobId={jobId} rel={rel} />
                      </td>
                    </tr>
                  ) : null}
                </Fragment>
              );
            })}
          </tbody>
        </table>
      </div>
    </div>
  );
}
