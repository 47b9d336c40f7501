// Submit: edit a job spec (YAML/JSON or Relax flags), dry-run it ("Validate": errors, warnings,
// derived values, resource demand, where it would queue), then submit and open the job.
import { useQuery } from "@tanstack/react-query";
import { type KeyboardEvent, useEffect, useMemo, useState } from "react";
import example from "../../../examples/grpo-arith.yaml?raw";
import { jobDetailQuery, useSubmitJob } from "../api/jobs";
import { queuesQuery, usePoolAccelerators } from "../api/platform";
import { useValidateSpec } from "../api/specs";
import type { JobCreate, SpecValidate, SpecValidation } from "../api/types";
import { ErrorPanel, IssueList } from "../components/common/ErrorPanel";
import { PageHead } from "../components/common/PageHead";
import { DemandView } from "../components/jobs/DemandView";
import { buildSubmission, type EditorMode, jobDocument } from "../lib/submission";
import { buildHash, navigate, type Route } from "../lib/router";

const DRAFT_KEY = "relax.submit.draft";
const FLAGS_EXAMPLE = `--train-backend torch
--hf-checkpoint artifacts://models/tiny
--prompt-data artifacts://datasets/arith/train.jsonl
--input-key input --label-key label --rm-type math
--rollout-batch-size 8 --n-samples-per-prompt 4 --rollout-max-response-len 8
--global-batch-size 32 --micro-batch-size 32 --num-rollout 5
--advantage-estimator grpo --lr 1e-3 --colocate
--resource '{"actor": [1, 1], "rollout": [1, 1]}'`;

interface Draft {
  mode: EditorMode;
  document: string;
  flags: string;
  name: string;
  queue: string;
  priority_class: string;
}

function loadDraft(): Draft {
  const fresh: Draft = { mode: "document", document: example, flags: FLAGS_EXAMPLE, name: "", queue: "", priority_class: "" };
  try {
    const raw = sessionStorage.getItem(DRAFT_KEY);
    return raw ? { ...fresh, ...(JSON.parse(raw) as Partial<Draft>) } : fresh;
  } catch {
    return fresh;
  }
}

function newIdempotencyKey(): string {
  return typeof crypto.randomUUID === "function" ? crypto.randomUUID() : `${Date.now()}-${Math.random().toString(36).slice(2)}`;
}

function ValidationView({ result }: { result: SpecValidation }) {
  const accelerator = usePoolAccelerators().get(String(result.pool ?? ""));
  const derived = Object.entries(result.derived ?? {});
  // Errors and warnings arrive apart; sort by severity anyway, so a list is never shown under the wrong head.
  const all = [...(result.errors ?? []), ...(result.warnings ?? [])];
  const errors = all.filter((i) => i.severity !== "warning");
  const warnings = all.filter((i) => i.severity === "warning");
  return (
    <div data-testid="validation">
      {result.valid ? (
        <div className="ok-panel" role="status">
          <strong>Valid.</strong> It would queue in <code>{result.queue}</code> on pool <code>{result.pool}</code>.
        </div>
      ) : (
        <div className="error-panel" role="alert">
          <h3>Invalid spec</h3>
          <div>Submitting would be refused. Fix these:</div>
          <IssueList issues={errors} />
        </div>
      )}
      {warnings.length ? (
        <div className="warn-panel" style={{ marginTop: 10 }}>
          <strong>Warnings</strong>
          <IssueList issues={warnings} />
        </div>
      ) : null}
      {result.demand ? (
        <div style={{ marginTop: 14 }}>
          <h3>Resource demand</h3>
          <DemandView demand={result.demand} accelerator={accelerator} />
        </div>
      ) : null}
      {derived.length ? (
        <div style={{ marginTop: 14 }}>
          <h3>Derived values</h3>
          <table className="kv-table">
            <caption className="sr-only">Derived values</caption>
            <tbody>
              {derived.map(([k, v]) => (
                <tr key={k}>
                  <td>{k}</td>
                  <td className="mono">{typeof v === "string" ? v : JSON.stringify(v)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
      {result.argv?.length ? (
        <details style={{ marginTop: 14 }}>
          <summary>Relax launcher flags ({result.argv.length})</summary>
          <pre className="block">{result.argv.join(" ").replace(/ --/g, "\n--")}</pre>
        </details>
      ) : null}
    </div>
  );
}

export function SubmitPage({ route }: { route: Route }) {
  const [draft, setDraft] = useState<Draft>(loadDraft);
  const [idempotencyKey, setIdempotencyKey] = useState(newIdempotencyKey);
  const validate = useValidateSpec();
  const submit = useSubmitJob();
  const queues = useQuery({ ...queuesQuery(), refetchInterval: false });
  const from = route.query.get("from");
  const source = useQuery({ ...jobDetailQuery(from ?? ""), enabled: !!from, refetchInterval: false });

  // "Resubmit…" from a job page: start from what that job was submitted with.
  useEffect(() => {
    if (!source.data) return;
    const { mode, text } = jobDocument(source.data);
    setDraft((d) => ({ ...d, mode, [mode === "flags" ? "flags" : "document"]: text, name: "", queue: "", priority_class: "" }));
    navigate(buildHash(["submit"]), { replace: true });
  }, [source.data]);

  useEffect(() => {
    try {
      sessionStorage.setItem(DRAFT_KEY, JSON.stringify(draft));
    } catch {
      /* private mode: no draft */
    }
  }, [draft]);

  const update = (changes: Partial<Draft>) => {
    setDraft((d) => ({ ...d, ...changes }));
    setIdempotencyKey(newIdempotencyKey()); // a changed request is a new submission
    validate.reset();
    submit.reset();
  };

  const text = draft.mode === "flags" ? draft.flags : draft.document;
  const built = useMemo(
    () => buildSubmission(draft.mode, text, { name: draft.name, queue: draft.queue, priority_class: draft.priority_class }),
    [draft.mode, text, draft.name, draft.queue, draft.priority_class],
  );

  const runValidate = () => {
    if (built.ok) validate.mutate(built.validate as SpecValidate);
  };
  const runSubmit = () => {
    if (!built.ok) return;
    submit.mutate(
      { body: built.create as JobCreate, idempotencyKey },
      { onSuccess: (job) => navigate(buildHash(["jobs", job.id])) },
    );
  };
  const onKey = (e: KeyboardEvent) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      if (e.shiftKey) runSubmit();
      else runValidate();
    }
  };

  const lines = text.split("\n").length;

  return (
    <div onKeyDown={onKey}>
      <PageHead title="Submit a job">
        <span className="muted small">Ctrl+Enter validates · Ctrl+Shift+Enter submits</span>
      </PageHead>
      <div className="grid-2">
        <div className="panel">
          <div className="toolbar">
            <label className="field">
              Name
              <input
                type="text"
                value={draft.name}
                onChange={(e) => update({ name: e.target.value })}
                placeholder={built.ok && built.documentName ? built.documentName : "from the spec"}
                aria-describedby="name-help"
              />
            </label>
            <label className="field">
              Queue
              <select value={draft.queue} onChange={(e) => update({ queue: e.target.value })}>
                <option value="">team default</option>
                {(queues.data ?? []).map((q) => (
                  <option key={q.name} value={q.name}>
                    {q.name} ({q.pool}, {q.used_gpus}/{q.nominal_gpus} used)
                  </option>
                ))}
              </select>
            </label>
            <label className="field">
              Priority
              <input value={draft.priority_class} onChange={(e) => update({ priority_class: e.target.value })} placeholder="normal" style={{ width: 90 }} />
            </label>
          </div>
          <p id="name-help" className="muted small" style={{ marginTop: -4 }}>
            Empty fields take the document’s <code>name</code>, <code>queue</code> and <code>priority_class</code>.
          </p>
          <div className="row" role="radiogroup" aria-label="Spec format" style={{ marginBottom: 8 }}>
            <label className="check">
              <input type="radio" name="mode" checked={draft.mode === "document"} onChange={() => update({ mode: "document" })} /> YAML / JSON
            </label>
            <label className="check">
              <input type="radio" name="mode" checked={draft.mode === "flags"} onChange={() => update({ mode: "flags" })} /> Relax flags
            </label>
            <span className="spacer" style={{ flex: 1 }} />
            <button
              type="button"
              className="link small"
              onClick={() => update(draft.mode === "flags" ? { flags: FLAGS_EXAMPLE } : { document: example })}
            >
              Reset to example
            </button>
          </div>
          <label htmlFor="spec-editor" className="sr-only">
            {draft.mode === "flags" ? "Relax flags" : "Job spec (YAML or JSON)"}
          </label>
          <textarea
            id="spec-editor"
            className="code"
            spellCheck={false}
            autoCapitalize="off"
            autoCorrect="off"
            value={text}
            rows={Math.min(40, Math.max(20, lines + 2))}
            onChange={(e) => update(draft.mode === "flags" ? { flags: e.target.value } : { document: e.target.value })}
            onKeyDown={(e) => {
              // Tab indents inside the editor; Escape then Tab leaves it (keyboard users are not trapped).
              if (e.key === "Tab" && !e.shiftKey && !e.ctrlKey && !e.altKey && e.currentTarget.dataset.escaped !== "1") {
                e.preventDefault();
                const el = e.currentTarget;
                const { selectionStart: s, selectionEnd: end } = el;
                const next = `${el.value.slice(0, s)}  ${el.value.slice(end)}`;
                update(draft.mode === "flags" ? { flags: next } : { document: next });
                requestAnimationFrame(() => el.setSelectionRange(s + 2, s + 2));
              }
              e.currentTarget.dataset.escaped = e.key === "Escape" ? "1" : "0";
            }}
            aria-describedby="editor-help"
          />
          <p id="editor-help" className="muted small">
            {draft.mode === "flags"
              ? "Relax CLI flags as you would pass them to the launcher; lines are joined, # comments dropped."
              : "A Relax spec (keys as in the reference, with - or _), or a job document with name, queue, priority_class, labels and spec. Tab indents; Esc then Tab leaves the editor."}
          </p>
          {!built.ok ? (
            <div className="error-panel" role="alert" data-testid="parse-error">
              {built.line ? `Line ${built.line}: ` : ""}
              {built.message}
            </div>
          ) : null}
          <div className="row" style={{ marginTop: 10 }}>
            <button type="button" onClick={runValidate} disabled={!built.ok || validate.isPending}>
              {validate.isPending ? "Validating…" : "Validate"}
            </button>
            <button type="button" className="primary" onClick={runSubmit} disabled={!built.ok || submit.isPending}>
              {submit.isPending ? "Submitting…" : "Submit"}
            </button>
          </div>
        </div>
        <div className="panel" aria-live="polite">
          <h2>Result</h2>
          {submit.isError ? <ErrorPanel error={submit.error} title="Submit refused" /> : null}
          {validate.isError ? <ErrorPanel error={validate.error} title="Validation request failed" /> : null}
          {validate.data ? <ValidationView result={validate.data} /> : null}
          {!validate.data && !validate.isError && !submit.isError ? (
            <p className="muted">
              <strong>Validate</strong> shows what the platform makes of this spec — errors with their field and a hint, warnings, derived
              defaults, the resource demand and the queue it would wait in — without submitting anything.
            </p>
          ) : null}
        </div>
      </div>
    </div>
  );
}
