// Hash routing: `#/jobs/<id>/metrics?x=y`. The API serves index.html only at `/`, so every deep link
// lives in the fragment and needs no server route.
import { useSyncExternalStore } from "react";

export interface Route {
  /** Path segments, decoded: `#/jobs/job_1/logs` -> ["jobs", "job_1", "logs"]. */
  path: string[];
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const raw = hash.replace(/^#/, "");
  const q = raw.indexOf("?");
  const pathPart = q === -1 ? raw : raw.slice(0, q);
  const query = new URLSearchParams(q === -1 ? "" : raw.slice(q + 1));
  const path = pathPart
    .split("/")
    .filter(Boolean)
    .map((s) => {
      try {
        return decodeURIComponent(s);
      } catch {
        return s;
      }
    });
  return { path, query };
}

type QueryValue = string | number | boolean | null | undefined | readonly string[];

/** `buildHash(["jobs", id], {tab: "logs"})` -> "#/jobs/<id>?tab=logs"; empty values are left out. */
export function buildHash(path: readonly string[], query: Record<string, QueryValue> = {}): string {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v == null || v === "" || v === false) continue;
    if (Array.isArray(v)) {
      if (v.length) params.set(k, v.join(","));
    } else {
      params.set(k, String(v));
    }
  }
  const qs = params.toString();
  return `#/${path.map(encodeURIComponent).join("/")}${qs ? `?${qs}` : ""}`;
}

/**
 * The parameter `name` taken out of the fragment: `#<name>=<value>` (then the jobs list) or
 * `#/jobs/<id>?<name>=<value>` (then that page). Returns the value (null when absent or blank) and the
 * fragment to show once it is removed.
 */
function takeFromHash(hash: string, name: string): { value: string | null; rest: string } {
  const raw = hash.replace(/^#/, "");
  if (raw.startsWith(`${name}=`)) {
    return { value: new URLSearchParams(raw).get(name)?.trim() || null, rest: "#/jobs" };
  }
  const route = parseHash(hash);
  const value = route.query.get(name)?.trim() || null;
  if (!value) return { value: null, rest: hash };
  route.query.delete(name);
  const qs = route.query.toString();
  return { value, rest: `#/${route.path.map(encodeURIComponent).join("/")}${qs ? `?${qs}` : ""}` };
}

/**
 * An API key handed over in the fragment, so that a CLI can open the dashboard signed in:
 * `#key=<key>` (then the jobs list) or `#/jobs/<id>?key=<key>` (then that page). Returns the key
 * and the fragment to show once it is removed.
 */
export function takeKeyFromHash(hash: string): { key: string | null; rest: string } {
  const { value, rest } = takeFromHash(hash, "key");
  return { key: value, rest };
}

/**
 * A one-time login code handed over in the fragment by `relaxctl dashboard`: `#code=<code>` (then the
 * jobs list) or `#/jobs/<id>?code=<code>` (then that page). Returns the code and the fragment to show
 * once it is removed.
 */
export function takeLoginCodeFromHash(hash: string): { code: string | null; rest: string } {
  const { value, rest } = takeFromHash(hash, "code");
  return { code: value, rest };
}

function subscribe(onChange: () => void): () => void {
  window.addEventListener("hashchange", onChange);
  return () => window.removeEventListener("hashchange", onChange);
}

const snapshot = () => window.location.hash;

/** The current route; re-renders on every hash change. */
export function useRoute(): Route {
  const hash = useSyncExternalStore(subscribe, snapshot, () => "");
  return parseHash(hash);
}

export function navigate(hash: string, opts: { replace?: boolean } = {}): void {
  if (opts.replace) {
    window.history.replaceState(null, "", `${window.location.pathname}${window.location.search}${hash}`);
    window.dispatchEvent(new HashChangeEvent("hashchange"));
  } else {
    window.location.hash = hash;
  }
}
