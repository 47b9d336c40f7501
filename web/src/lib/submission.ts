// Turns what the user typed on the Submit page into API requests: a YAML/JSON document (a bare
// Relax spec, or a job document with name/queue/priority_class/spec like examples/*.yaml) or Relax CLI
// flags. Pure: unit-tested.
import { dump, load, YAMLException } from "js-yaml";

export type EditorMode = "document" | "flags";

export interface SubmitFields {
  name?: string;
  queue?: string;
  priority_class?: string;
}

/** Keys of a job document (POST /v1/jobs); a document without `spec` or `args` is a bare spec. */
const JOB_KEYS = ["spec", "args"];

export interface Built {
  ok: true;
  /** Body of POST /v1/jobs. */
  create: Record<string, unknown>;
  /** Body of POST /v1/specs/validate. */
  validate: Record<string, unknown>;
  /** The name the job will get from the document (before the Name field overrides it). */
  documentName: string | null;
}

export interface NotBuilt {
  ok: false;
  message: string;
  line: number | null;
}

/** Relax flags as one string: `\`-newline continuations joined, `#` comment lines dropped. */
export function normalizeFlags(text: string): string {
  return text
    .replace(/\\\r?\n/g, " ")
    .split(/\r?\n/)
    .filter((l) => !l.trim().startsWith("#"))
    .join(" ")
    .replace(/\s+/g, " ")
    .trim();
}

export function buildSubmission(mode: EditorMode, text: string, fields: SubmitFields = {}): Built | NotBuilt {
  let doc: Record<string, unknown>;
  if (mode === "flags") {
    const args = normalizeFlags(text);
    if (!args) return { ok: false, message: "Type Relax flags, e.g. --rollout-batch-size 8 …", line: null };
    doc = { args };
  } else {
    let parsed: unknown;
    try {
      parsed = load(text);
    } catch (err) {
      if (err instanceof YAMLException) {
        return { ok: false, message: `YAML: ${err.reason}`, line: err.mark ? err.mark.line + 1 : null };
      }
      return { ok: false, message: String(err), line: null };
    }
    if (parsed == null) return { ok: false, message: "The document is empty.", line: null };
    if (typeof parsed !== "object" || Array.isArray(parsed)) {
      return { ok: false, message: "The document must be a mapping: Relax parameters, or {name, queue, spec}.", line: null };
    }
    const obj = parsed as Record<string, unknown>;
    doc = JOB_KEYS.some((k) => k in obj) ? { ...obj } : { spec: obj };
  }
  const documentName = typeof doc.name === "string" ? doc.name : null;
  const name = fields.name?.trim();
  const queue = fields.queue?.trim();
  const priorityClass = fields.priority_class?.trim();
  if (name) doc.name = name;
  if (queue) doc.queue = queue;
  if (priorityClass) {
    delete doc["priority-class"];
    doc.priority_class = priorityClass;
  }
  // The dry run takes only what decides validity and placement; anything else a job document has
  // (name, priority class, labels) is checked by the submit itself.
  const { name: _n, priority_class: _p, "priority-class": _pc, labels: _l, ...validate } = doc;
  return { ok: true, create: doc, validate, documentName };
}

/** A job document in YAML, for "Resubmit…" of an existing job. */
export function jobDocument(job: {
  name: string;
  queue: string;
  priority_class: string;
  labels: Record<string, string>;
  submitted: Record<string, unknown>;
}): { mode: EditorMode; text: string } {
  if (Array.isArray(job.submitted.args)) {
    return { mode: "flags", text: (job.submitted.args as string[]).map(quoteArg).join(" ").replace(/ --/g, "\n--") };
  }
  const doc: Record<string, unknown> = { name: job.name, queue: job.queue };
  if (job.priority_class && job.priority_class !== "normal") doc.priority_class = job.priority_class;
  if (Object.keys(job.labels).length) doc.labels = job.labels;
  doc.spec = job.submitted.spec ?? {};
  return { mode: "document", text: dump(doc, { lineWidth: 120, noRefs: true, flowLevel: 2 }) };
}

function quoteArg(a: string): string {
  return /^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'"'"'`)}'`;
}
