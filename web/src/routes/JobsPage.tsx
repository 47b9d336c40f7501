// The jobs list: filters and cursor paging live in the URL, so a filtered view is a link.
import { useQuery } from "@tanstack/react-query";
import { type FormEvent, useEffect, useState } from "react";
import { jobsListQuery } from "../api/jobs";
import { JOB_STATUSES, type JobStatus, TERMINAL_STATUSES } from "../api/types";
import { ErrorPanel } from "../components/common/ErrorPanel";
import { Loading } from "../components/common/Loading";
import { PageHead } from "../components/common/PageHead";
import { useNow } from "../components/common/useNow";
import { JobsTable } from "../components/jobs/JobsTable";
import { formatRelative, isTerminal } from "../lib/format";
import { buildHash, navigate, type Route } from "../lib/router";
import { SearchField } from "../components/common/SearchField";

const PAGE_SIZE = 50;

/** The statuses an operator usually wants together. */
const PRESETS: Record<string, readonly JobStatus[]> = {
  active: JOB_STATUSES.filter((s) => !isTerminal(s)),
  finished: TERMINAL_STATUSES,
};

export function JobsPage({ route }: { route: Route }) {
  const q = route.query;
  const status = (q.get("status") ?? "").split(",").filter(Boolean);
  const name = q.get("name") ?? "";
  const queue = q.get("queue") ?? "";
  const after = q.get("after") ?? undefined;
  const live = q.get("live") !== "0";
  const [nameInput, setNameInput] = useState(name);
  const [queueInput, setQueueInput] = useState(queue);
  // Cursors of the pages before this one, for "Previous"; the API pages forward only.
  const [history, setHistory] = useState<string[]>([]);
  const now = useNow();

  useEffect(() => setNameInput(name), [name]);
  useEffect(() => setQueueInput(queue), [queue]);

  const list = useQuery(jobsListQuery({ status, name, queue, after, limit: PAGE_SIZE }, { live }));

  const go = (changes: Record<string, string | string[] | null | undefined>, opts: { keepPage?: boolean } = {}) => {
    const next: Record<string, string | string[] | null | undefined> = {
      status,
      name,
      queue,
      after: opts.keepPage ? after : undefined,
      live: live ? undefined : "0",
      ...changes,
    };
    if (!opts.keepPage && !("after" in changes)) setHistory([]);
    navigate(buildHash(["jobs"], next), { replace: true });
  };

  const toggleStatus = (s: string) => go({ status: status.includes(s) ? status.filter((x) => x !== s) : [...status, s] });
  const onSearch = (e: FormEvent) => {
    e.preventDefault();
    go({ name: nameInput.trim(), queue: queueInput.trim() });
  };

  return (
    <div>
      <PageHead title="Jobs">
        <label className="check small">
          <input type="checkbox" checked={live} onChange={(e) => go({ live: e.target.checked ? undefined : "0" }, { keepPage: true })} />
          Auto-refresh
        </label>
        <span className="muted small" aria-live="polite">
          {list.dataUpdatedAt ? `updated ${formatRelative(new Date(list.dataUpdatedAt), now)}` : ""}
          {list.isFetching ? " · refreshing" : ""}
        </span>
        <button type="button" onClick={() => void list.refetch()}>
          Refresh
        </button>
        <a className="button" href="#/submit">
          Submit a job
        </a>
      </PageHead>

      <div className="panel" style={{ marginBottom: 14 }}>
        <form className="toolbar" onSubmit={onSearch} style={{ marginBottom: 8 }} role="search" aria-label="Filter jobs">
          <SearchField label="Name (exact)" value={nameInput} onChange={setNameInput} placeholder="grpo-arith" />
          <SearchField label="Queue" value={queueInput} onChange={setQueueInput} placeholder="default" />
          <button type="submit">Apply</button>
          {status.length || name || queue ? (
            <button type="button" className="link" onClick={() => go({ status: [], name: "", queue: "" })}>
              Clear filters
            </button>
          ) : null}
        </form>
        <div className="row" role="group" aria-label="Status filter">
          <span className="muted small">Status:</span>
          <div className="chip-group">
            {Object.entries(PRESETS).map(([label, set]) => {
              const on = set.length === status.length && set.every((s) => status.includes(s));
              return (
                <button key={label} type="button" className="chip" aria-pressed={on} onClick={() => go({ status: on ? [] : [...set] })}>
                  {label}
                </button>
              );
            })}
            <span aria-hidden="true" className="muted">|</span>
            {JOB_STATUSES.map((s) => (
              <button key={s} type="button" className="chip" aria-pressed={status.includes(s)} onClick={() => toggleStatus(s)}>
                {s}
              </button>
            ))}
          </div>
        </div>
      </div>

      {list.isError ? <ErrorPanel error={list.error} /> : null}
      <div className="panel" style={{ padding: 0 }}>
        {list.isPending ? (
          <div style={{ padding: 14 }}>
            <Loading label="Loading jobs…" />
          </div>
        ) : list.data?.data.length ? (
          <JobsTable jobs={list.data.data} now={now} />
        ) : (
          <div className="table-empty">
            {status.length || name || queue ? "No job matches these filters." : "No jobs yet. "}
            {!(status.length || name || queue) ? <a href="#/submit">Submit the first one.</a> : null}
          </div>
        )}
      </div>
      <nav className="pager" aria-label="Pages">
        <button
          type="button"
          disabled={!after}
          onClick={() => {
            const prev = history[history.length - 1];
            setHistory(history.slice(0, -1));
            go({ after: prev || undefined }, { keepPage: true });
          }}
        >
          ← Newer
        </button>
        <button
          type="button"
          disabled={!list.data?.next_cursor}
          onClick={() => {
            setHistory([...history, after ?? ""]);
            go({ after: list.data?.next_cursor ?? undefined }, { keepPage: true });
          }}
        >
          Older →
        </button>
      </nav>
    </div>
  );
}
