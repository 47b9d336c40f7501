import { load } from "js-yaml";
import { describe, expect, it } from "vitest";
import { buildSubmission, jobDocument, normalizeFlags } from "../../src/lib/submission";

describe("Submit page: building requests from the editor", () => {
  it("treats a mapping without spec/args as a bare Relax spec", () => {
    const b = buildSubmission("document", "rollout-batch-size: 8\nlr: 1.0e-3\n");
    expect(b).toMatchObject({ ok: true, create: { spec: { "rollout-batch-size": 8, lr: 0.001 } }, documentName: null });
  });

  it("reads a job document like examples/*.yaml, fields overriding it", () => {
    const text = "name: grpo-arith\nqueue: default\npriority_class: high\nlabels: {team: rl}\nspec:\n  num-rollout: 5\n";
    const b = buildSubmission("document", text, { name: "mine", priority_class: "low" });
    expect(b).toMatchObject({
      ok: true,
      documentName: "grpo-arith",
      create: { name: "mine", queue: "default", priority_class: "low", labels: { team: "rl" }, spec: { "num-rollout": 5 } },
    });
    // The dry run gets only what it accepts.
    if (b.ok) expect(b.validate).toEqual({ queue: "default", spec: { "num-rollout": 5 } });
  });

  it("accepts JSON as well as YAML", () => {
    expect(buildSubmission("document", '{"spec": {"lr": 0.1}}')).toMatchObject({ ok: true, create: { spec: { lr: 0.1 } } });
  });

  it("reports YAML errors with their line", () => {
    const b = buildSubmission("document", "spec:\n  lr: 1\n bad: [\n");
    expect(b.ok).toBe(false);
    if (!b.ok) expect(b.line).toBeGreaterThan(1);
  });

  it("refuses empty documents and lists", () => {
    expect(buildSubmission("document", "").ok).toBe(false);
    expect(buildSubmission("document", "- a\n- b").ok).toBe(false);
  });

  it("sends Relax flags as one args string, joining continuations and dropping comments", () => {
    expect(normalizeFlags("--a 1 \\\n  --b 2\n# note\n--c '{\"x\": [1, 2]}'")).toBe("--a 1 --b 2 --c '{\"x\": [1, 2]}'");
    expect(buildSubmission("flags", "--lr 1e-3", { name: "f" })).toMatchObject({ ok: true, create: { args: "--lr 1e-3", name: "f" } });
    expect(buildSubmission("flags", "   ").ok).toBe(false);
  });

  it("turns a job back into an editable document (Resubmit)", () => {
    const doc = jobDocument({ name: "j", queue: "q", priority_class: "high", labels: {}, submitted: { spec: { "num-rollout": 5, resource: { actor: [1, 1] } }, warnings: [] } });
    expect(doc.mode).toBe("document");
    expect(load(doc.text)).toEqual({ name: "j", queue: "q", priority_class: "high", spec: { "num-rollout": 5, resource: { actor: [1, 1] } } });
    const flags = jobDocument({ name: "j", queue: "q", priority_class: "normal", labels: {}, submitted: { args: ["--lr", "1e-3", "--resource", '{"actor": [1, 1]}'] } });
    expect(flags.mode).toBe("flags");
    expect(normalizeFlags(flags.text)).toBe("--lr 1e-3 --resource '{\"actor\": [1, 1]}'");
  });
});
