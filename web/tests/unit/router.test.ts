import { describe, expect, it } from "vitest";
import { buildHash, parseHash, takeKeyFromHash, takeLoginCodeFromHash } from "../../src/lib/router";

describe("hash routes", () => {
  it("parses path segments and the query", () => {
    const r = parseHash("#/jobs/job_1/logs?level=ERROR");
    expect(r.path).toEqual(["jobs", "job_1", "logs"]);
    expect(r.query.get("level")).toBe("ERROR");
    expect(parseHash("").path).toEqual([]);
    expect(parseHash("#/").path).toEqual([]);
  });

  it("builds links that parse back, leaving out empty values", () => {
    const h = buildHash(["jobs"], { status: ["QUEUED", "RUNNING"], name: "a b", after: undefined, live: false });
    expect(h).toBe("#/jobs?status=QUEUED%2CRUNNING&name=a+b");
    const r = parseHash(h);
    expect(r.query.get("status")).toBe("QUEUED,RUNNING");
    expect(r.query.get("name")).toBe("a b");
    expect(parseHash(buildHash(["jobs", "job/odd id"])).path).toEqual(["jobs", "job/odd id"]);
  });
});

describe("API key handed over in the URL", () => {
  it("takes #key=<key> and goes to the jobs list", () => {
    expect(takeKeyFromHash("#key=rlx_abc")).toEqual({ key: "rlx_abc", rest: "#/jobs" });
  });

  it("takes ?key= from a deep link and keeps the rest of it", () => {
    expect(takeKeyFromHash("#/jobs/job_1/logs?key=rlx_abc&x=1")).toEqual({ key: "rlx_abc", rest: "#/jobs/job_1/logs?x=1" });
  });

  it("leaves a hash without a key alone", () => {
    expect(takeKeyFromHash("#/jobs?name=x")).toEqual({ key: null, rest: "#/jobs?name=x" });
    expect(takeKeyFromHash("#key=")).toEqual({ key: null, rest: "#/jobs" });
  });
});

describe("one-time login code handed over in the URL", () => {
  it("takes #code=<code> and goes to the jobs list", () => {
    expect(takeLoginCodeFromHash("#code=rlc_abc.def")).toEqual({ code: "rlc_abc.def", rest: "#/jobs" });
  });

  it("takes ?code= from a deep link and keeps the rest of it", () => {
    expect(takeLoginCodeFromHash("#/jobs/job_1?code=rlc_x&tab=logs")).toEqual({ code: "rlc_x", rest: "#/jobs/job_1?tab=logs" });
  });

  it("leaves a hash without a code alone", () => {
    expect(takeLoginCodeFromHash("#/jobs?name=x")).toEqual({ code: null, rest: "#/jobs?name=x" });
    expect(takeLoginCodeFromHash("#key=rlx_abc")).toEqual({ code: null, rest: "#key=rlx_abc" });
  });
});
