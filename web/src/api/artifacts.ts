// Files under a job's output directory (`GET /v1/jobs/{id}/artifacts/{path}`): fetched with the API
// key (a plain link cannot carry it), for previews and downloads.
import { ApiError, authHeaders, handleUnauthenticated } from "./client";

/** The path of `absolute` inside the job's output directory, or null when it lies elsewhere. */
export function artifactPath(outputDir: string, absolute: string): string | null {
  const root = outputDir.replace(/\/+$/, "");
  if (!absolute.startsWith(`${root}/`)) return absolute.startsWith("/") ? null : absolute.replace(/^\.\//, "");
  return absolute.slice(root.length + 1);
}

export async function fetchArtifact(jobId: string, path: string, signal?: AbortSignal): Promise<Response> {
  const url = `/v1/jobs/${encodeURIComponent(jobId)}/artifacts/${path.split("/").map(encodeURIComponent).join("/")}`;
  let res: Response;
  try {
    res = await fetch(url, { headers: authHeaders(), signal });
  } catch (err) {
    throw new ApiError(0, "network", `The API is unreachable (${(err as Error).message}).`);
  }
  if (!res.ok) {
    if (res.status === 401) handleUnauthenticated();
    const body = await res.json().catch(() => null);
    throw ApiError.fromResponse(res, body);
  }
  return res;
}

/** Save an artifact through the browser's download. */
export async function downloadArtifact(jobId: string, path: string): Promise<void> {
  const res = await fetchArtifact(jobId, path);
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = path.split("/").pop() || "artifact";
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** The first `limit` records of a JSON-lines artifact (rollout records, predictions). */
export async function previewJsonl(jobId: string, path: string, limit = 20, signal?: AbortSignal): Promise<unknown[]> {
  const text = await (await fetchArtifact(jobId, path, signal)).text();
  const out: unknown[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      out.push({ unparsed: line });
    }
    if (out.length >= limit) break;
  }
  return out;
}
