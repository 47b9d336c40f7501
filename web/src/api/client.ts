// The one HTTP client of the dashboard: typed by the generated schema, signed with the API key,
// every failure turned into an ApiError carrying the API's error envelope.
import createClient, { type Middleware } from "openapi-fetch";
import { getApiKey, signOut } from "../lib/auth";
import type { components, paths } from "./gen/schema";

export type Schemas = components["schemas"];

/**
 * A failed API call: `{"error": {"code", "message", "details", "request_id"}}` from the API, or a
 * network failure (status 0).
 */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: unknown;
  readonly requestId: string | null;

  constructor(status: number, code: string, message: string, details: unknown = null, requestId: string | null = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.details = details;
    this.requestId = requestId;
  }

  /** `details.issues[]` when the API listed field problems (validation errors). */
  get issues(): Schemas["SpecIssue"][] {
    const d = this.details as { issues?: unknown } | null;
    return Array.isArray(d?.issues) ? (d.issues as Schemas["SpecIssue"][]) : [];
  }

  static fromResponse(response: Response, body: unknown): ApiError {
    const env = (body as { error?: Record<string, unknown> } | null)?.error;
    const requestId =
      (typeof env?.request_id === "string" ? env.request_id : null) ?? response.headers.get("x-request-id");
    if (env && typeof env.message === "string") {
      return new ApiError(response.status, String(env.code ?? "error"), env.message, env.details ?? null, requestId);
    }
    const text = typeof body === "string" && body ? body.slice(0, 300) : response.statusText || "request failed";
    return new ApiError(response.status, `http_${response.status}`, text, null, requestId);
  }
}

export const UNAUTHENTICATED_NOTICE = "The API rejected this key (401). Sign in again.";

/**
 * Called on every 401: the key is wrong, revoked or expired, so go back to the sign-in screen (saying
 * which, when the API told the key's holder: `auth.key_revoked`, `auth.key_expired`).
 */
export function handleUnauthenticated(error?: ApiError): void {
  if (error && (error.code === "auth.key_expired" || error.code === "auth.key_revoked")) {
    signOut(`The API rejected this key: ${error.message}. Sign in with a new key.`);
    return;
  }
  signOut(UNAUTHENTICATED_NOTICE);
}

/** Headers for calls made outside the typed client (the SSE stream, artifact downloads). */
export function authHeaders(extra: Record<string, string> = {}): Record<string, string> {
  const key = getApiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

const signRequests: Middleware = {
  onRequest({ request }) {
    const key = getApiKey();
    if (key) request.headers.set("Authorization", `Bearer ${key}`);
    return request;
  },
};

// Same origin: the API serves the dashboard, and `npm run dev` proxies /v1 to it.
export const api = createClient<paths>({ baseUrl: "" });
api.use(signRequests);

interface FetchResult<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/**
 * Await a typed call and return its data, or throw an ApiError. A 401 signs out, except where the
 * caller is trying a key (the sign-in screen).
 */
export async function unwrap<T>(call: Promise<FetchResult<T>>, opts: { signOutOn401?: boolean } = {}): Promise<T> {
  let result: FetchResult<T>;
  try {
    result = await call;
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, "network", `The API is unreachable (${(err as Error).message}).`);
  }
  const { data, error, response } = result;
  if (!response.ok) {
    const failure = ApiError.fromResponse(response, error);
    if (response.status === 401 && opts.signOutOn401 !== false) handleUnauthenticated(failure);
    throw failure;
  }
  return data as T;
}
