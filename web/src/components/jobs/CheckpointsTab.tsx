// Checkpoints tab: what the job saved (step, size, format, path), newest first.
import { useQuery } from "@tanstack/react-query";
import { artifactPath } from "../../api/artifacts";
import { jobCheckpointsQuery } from "../../api/jobs";
import { formatBytes, formatTime } from "../../lib/format";
import { ErrorPanel } from "../common/ErrorPanel";
import { Loading } from "../common/Loading";

export function CheckpointsTab({ jobId, outputDir, running }: { jobId: string; outputDir: string; running: boolean }) {
  const q = useQuery(jobCheckpointsQuery(jobId, running));
  if (q.isPending) return <Loading label="Loading checkpoints…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  if (!q.data.length)
    return <div className="panel table-empty">No checkpoints yet{running ? " (set save and save-interval in the spec to get some)" : ""}.</div>;
  const rows = [...q.data].sort((a, b) => b.step - a.step || b.id - a.id);
  return (
    <div className="panel table-wrap">
      <table>
        <caption className="sr-only">Checkpoints</caption>
        <thead>
          <tr>
            <th scope="col" className="num">Step</th>
            <th scope="col" className="num">Size</th>
            <th scope="col">Format</th>
            <th scope="col">Path (in the output directory)</th>
            <th scope="col" className="num">Attempt</th>
            <th scope="col">Saved</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((c) => (
            <tr key={c.id}>
              <td className="num">{c.step}</td>
              <td className="num">{formatBytes(c.size_bytes)}</td>
              <td>{c.format}</td>
              <td className="mono" style={{ overflowWrap: "anywhere" }} title={c.path}>
                {artifactPath(outputDir, c.path) ?? c.path}
              </td>
              <td className="num">{c.attempt}</td>
              <td className="nowrap">{formatTime(c.time)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
