import { QueryClient } from "@tanstack/react-query";
import { describe, expect, it } from "vitest";
import { jobKeys, normalizeFilter } from "../../src/api/jobs";
import { platformKeys } from "../../src/api/platform";

describe("job query-key factory (jobKeys)", () => {
  it("nests every key under its parent", () => {
    expect(jobKeys.all).toEqual(["jobs"]);
    expect(jobKeys.lists()).toEqual(["jobs", "list"]);
    expect(jobKeys.list({ name: "x" })).toEqual(["jobs", "list", { name: "x" }]);
    expect(jobKeys.detail("job_1")).toEqual(["jobs", "detail", "job_1"]);
    for (const sub of ["events", "metrics", "logs", "checkpoints", "rollouts"] as const) {
      expect(jobKeys[sub]("job_1")).toEqual(["jobs", "detail", "job_1", sub]);
    }
  });

  it("gives equal filters equal keys (status order, case, blanks)", () => {
    expect(jobKeys.list({ status: ["running", "QUEUED"], name: " grpo ", queue: "" })).toEqual(
      jobKeys.list({ status: ["QUEUED", "RUNNING", "RUNNING"], name: "grpo" }),
    );
    expect(normalizeFilter({ status: [], name: "  ", after: undefined })).toEqual({});
  });

  it("invalidating a job's detail refreshes its children, not other jobs or the lists", async () => {
    const qc = new QueryClient();
    const keys = [jobKeys.detail("a"), jobKeys.metrics("a"), jobKeys.logs("a"), jobKeys.detail("b"), jobKeys.list({})];
    for (const k of keys) qc.setQueryData(k, 1);
    await qc.invalidateQueries({ queryKey: jobKeys.detail("a") });
    const stale = keys.map((k) => qc.getQueryState(k)?.isInvalidated);
    expect(stale).toEqual([true, true, true, false, false]);
  });

  it("invalidating lists() reaches every filtered list and no detail", async () => {
    const qc = new QueryClient();
    qc.setQueryData(jobKeys.list({ status: ["RUNNING"] }), 1);
    qc.setQueryData(jobKeys.list({ name: "x", after: "job_9" }), 1);
    qc.setQueryData(jobKeys.detail("a"), 1);
    await qc.invalidateQueries({ queryKey: jobKeys.lists() });
    expect(qc.getQueryState(jobKeys.list({ status: ["RUNNING"] }))?.isInvalidated).toBe(true);
    expect(qc.getQueryState(jobKeys.list({ name: "x", after: "job_9" }))?.isInvalidated).toBe(true);
    expect(qc.getQueryState(jobKeys.detail("a"))?.isInvalidated).toBe(false);
  });

  it("keeps platform keys apart from job keys", () => {
    expect(platformKeys.pools()).toEqual(["platform", "pools"]);
    expect(platformKeys.queues()).toEqual(["platform", "queues"]);
  });
});
