// Logs tab: the job's log lines, live from the stream; follow the tail, filter, pick a level,
// download what is loaded.
import { useQuery } from "@tanstack/react-query";
import { useEffect, useMemo, useRef, useState } from "react";
import { jobLogsQuery, MAX_LOG_LINES } from "../../api/jobs";
import type { LogLine } from "../../api/types";
import { formatClock } from "../../lib/format";
import { ErrorPanel } from "../common/ErrorPanel";
import { Loading } from "../common/Loading";
import { SearchField } from "../common/SearchField";

const SHOWN = 5_000;
const LEVELS = ["ALL", "DEBUG", "INFO", "WARNING", "ERROR"] as const;
const RANK: Record<string, number> = { DEBUG: 10, INFO: 20, WARN: 30, WARNING: 30, ERROR: 40, CRITICAL: 50 };

function download(jobId: string, lines: readonly LogLine[]) {
  const text = lines.map((l) => `${l.time} [${l.attempt}] ${l.level} ${l.source}: ${l.message}`).join("\n");
  const url = URL.createObjectURL(new Blob([`${text}\n`], { type: "text/plain" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = `${jobId}.log`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function LogsTab({ jobId, running }: { jobId: string; running: boolean }) {
  const q = useQuery(jobLogsQuery(jobId));
  const [filter, setFilter] = useState("");
  const [level, setLevel] = useState<(typeof LEVELS)[number]>("ALL");
  const [follow, setFollow] = useState(true);
  const box = useRef<HTMLDivElement>(null);

  const lines = q.data?.lines;
  const visible = useMemo(() => {
    const f = filter.trim().toLowerCase();
    const min = level === "ALL" ? 0 : (RANK[level] ?? 0);
    const out = (lines ?? []).filter(
      (l) => (RANK[l.level.toUpperCase()] ?? 20) >= min && (!f || l.message.toLowerCase().includes(f) || l.source.toLowerCase().includes(f)),
    );
    return out.length > SHOWN ? out.slice(out.length - SHOWN) : out;
  }, [lines, filter, level]);

  useEffect(() => {
    if (follow && box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [visible, follow]);

  if (q.isPending) return <Loading label="Loading logs…" />;
  if (q.isError) return <ErrorPanel error={q.error} />;
  const total = q.data.lines.length;

  return (
    <div>
      <div className="toolbar">
        <SearchField label="Filter" value={filter} onChange={setFilter} placeholder="text in message or source" />
        <label className="field">
          Level at least
          <select value={level} onChange={(e) => setLevel(e.target.value as (typeof LEVELS)[number])}>
            {LEVELS.map((l) => (
              <option key={l}>{l}</option>
            ))}
          </select>
        </label>
        <label className="check">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} /> Follow
        </label>
        <span className="spacer" />
        <span className="muted small">
          {visible.length < total ? `${visible.length} of ` : ""}
          {total} lines{q.data.truncated ? ` (first ${MAX_LOG_LINES} of the log, then live)` : ""}
          {running ? " · live" : ""}
        </span>
        <button type="button" onClick={() => download(jobId, q.data.lines)} disabled={!total}>
          Download
        </button>
      </div>
      <div
        className="logs"
        ref={box}
        tabIndex={0}
        role="log"
        aria-label="Job logs"
        aria-live="off"
        data-testid="logs"
        onWheel={(e) => {
          if (e.deltaY < 0 && follow) setFollow(false);
        }}
      >
        {total === 0 ? (
          <div className="log-line" style={{ color: "#8b949e" }}>
            {running ? "Waiting for the first log line…" : "No log lines."}
          </div>
        ) : null}
        {visible.map((l, i) => {
          const prev = visible[i - 1];
          return (
            <div key={l.id}>
              {prev && prev.attempt !== l.attempt ? <div className="log-attempt">── attempt {l.attempt} ──</div> : null}
              <div className="log-line" data-testid="log-line">
                <span className="log-time" title={l.time}>
                  {formatClock(l.time, true)}
                </span>
                <span className={`log-level log-level-${l.level.toUpperCase()}`}>{l.level.toUpperCase().slice(0, 5)}</span>
                <span className="log-src" title={l.source}>
                  {l.source}
                </span>
                <span>{l.message}</span>
              </div>
            </div>
          );
        })}
      </div>
    </div>
  );
}
