import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/api/client";
import { artifactPath } from "../../src/api/artifacts";

describe("API error envelope (ApiError)", () => {
  it("reads code, message, field issues and request_id", () => {
    const body = {
      error: {
        code: "spec.invalid",
        message: "invalid job spec",
        details: { issues: [{ code: "spec.unknown_key", field: "rollout-batch-sise", message: "unknown parameter", hint: "did you mean --rollout-batch-size?" }] },
        request_id: "abc123",
      },
    };
    const err = ApiError.fromResponse(new Response(null, { status: 422 }), body);
    expect(err).toMatchObject({ status: 422, code: "spec.invalid", message: "invalid job spec", requestId: "abc123" });
    expect(err.issues[0]?.field).toBe("rollout-batch-sise");
  });

  it("falls back to the status and the X-Request-ID header for bodies that are not envelopes", () => {
    const res = new Response(null, { status: 502, statusText: "Bad Gateway", headers: { "x-request-id": "rid" } });
    const err = ApiError.fromResponse(res, "<html>proxy error</html>");
    expect(err).toMatchObject({ status: 502, code: "http_502", requestId: "rid" });
    expect(err.issues).toEqual([]);
  });
});

describe("artifact paths", () => {
  it("makes paths relative to the job's output directory", () => {
    expect(artifactPath("/a/jobs/job_1", "/a/jobs/job_1/rollout_result/train/3.jsonl")).toBe("rollout_result/train/3.jsonl");
    expect(artifactPath("/a/jobs/job_1/", "/a/jobs/job_1/x")).toBe("x");
    expect(artifactPath("/a/jobs/job_1", "/elsewhere/x")).toBeNull();
    expect(artifactPath("/a/jobs/job_1", "rollout_result/x.jsonl")).toBe("rollout_result/x.jsonl");
  });
});
