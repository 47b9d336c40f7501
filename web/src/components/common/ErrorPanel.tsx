// Shows a failed call the way the API explains it: message, field issues (field, message, hint)
// and the request id to quote when reporting it.
import { ApiError } from "../../api/client";
import type { SpecIssue } from "../../api/types";

/** Field issues, errors first; a warning is marked as one (the API lists both together). */
export function IssueList({ issues }: { issues: readonly SpecIssue[] }) {
  if (!issues.length) return null;
  const sorted = [...issues].sort((a, b) => Number(a.severity === "warning") - Number(b.severity === "warning"));
  return (
    <ul className="issues">
      {sorted.map((issue, i) => (
        <li key={`${issue.field ?? ""}-${issue.code ?? ""}-${i}`} data-testid="field-issue" data-field={issue.field ?? ""}>
          {issue.severity === "warning" ? <span className="issue-severity">warning · </span> : null}
          {issue.field ? <span className="issue-field">{issue.field}</span> : null}
          {issue.field ? ": " : null}
          {issue.message || issue.code}
          {issue.code && issue.message ? <span className="hint"> ({issue.code})</span> : null}
          {issue.hint ? <div className="hint">hint: {issue.hint}</div> : null}
        </li>
      ))}
    </ul>
  );
}

export function ErrorPanel({ error, title }: { error: unknown; title?: string }) {
  if (!error) return null;
  const api = error instanceof ApiError ? error : null;
  const message = error instanceof Error ? error.message : String(error);
  return (
    <div className="error-panel" role="alert" data-testid="error-panel">
      <h3>{title ?? (api && api.status ? `Request failed (${api.status} ${api.code})` : "Something went wrong")}</h3>
      <div>{message}</div>
      {api ? <IssueList issues={api.issues} /> : null}
      {api?.requestId ? (
        <div className="request-id">
          request_id: <code>{api.requestId}</code>
        </div>
      ) : null}
    </div>
  );
}
