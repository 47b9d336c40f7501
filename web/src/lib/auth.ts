// The API key the dashboard signs in with: kept in localStorage, dropped on a 401.
import { useSyncExternalStore } from "react";
import { navigate, takeKeyFromHash, takeLoginCodeFromHash } from "./router";

const STORAGE_KEY = "relax.apiKey";

type AuthState = { key: string | null; notice: string | null };

let state: AuthState = { key: readStored(), notice: null };
const listeners = new Set<() => void>();

function readStored(): string | null {
  try {
    return window.localStorage.getItem(STORAGE_KEY);
  } catch {
    return null; // storage disabled: the key lives for this page only
  }
}

function set(next: AuthState): void {
  state = next;
  for (const l of listeners) l();
}

export function getApiKey(): string | null {
  return state.key;
}

export function signIn(key: string): void {
  const k = key.trim();
  try {
    window.localStorage.setItem(STORAGE_KEY, k);
  } catch {
    /* keep it in memory */
  }
  set({ key: k, notice: null });
}

/** Forget the key; `notice` explains why on the sign-in screen (e.g. the key was rejected). */
export function signOut(notice: string | null = null): void {
  try {
    window.localStorage.removeItem(STORAGE_KEY);
  } catch {
    /* nothing stored */
  }
  if (state.key !== null || state.notice !== notice) set({ key: null, notice });
}

export const LOGIN_CODE_REFUSED_NOTICE =
  "This sign-in link was used already or has expired. Run `relaxctl dashboard` again, or sign in with an API key.";

/**
 * `#code=<code>` in the address (`relaxctl dashboard`): take it out of the address bar and history at
 * once, then exchange it (once) for a session key, which signs in like a key typed in by hand.
 * `#key=<key>` (a key pasted into a link by hand) signs in with that key and leaves the address too.
 */
export function adoptKeyFromLocation(): void {
  const login = takeLoginCodeFromHash(window.location.hash);
  if (login.code) {
    navigate(login.rest, { replace: true });
    void exchangeLoginCode(login.code);
    return;
  }
  const { key, rest } = takeKeyFromHash(window.location.hash);
  if (!key) return;
  signIn(key);
  navigate(rest, { replace: true });
}

/** POST /v1/auth/sessions: a login code for a session key. */
export async function exchangeLoginCode(code: string): Promise<boolean> {
  try {
    const response = await fetch("/v1/auth/sessions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code }),
    });
    const body = (await response.json().catch(() => null)) as { key?: unknown } | null;
    if (response.ok && typeof body?.key === "string") {
      signIn(body.key);
      return true;
    }
    signOut(LOGIN_CODE_REFUSED_NOTICE);
  } catch {
    signOut("The API is unreachable; the sign-in link could not be used.");
  }
  return false;
}

export function useAuth(): AuthState {
  return useSyncExternalStore(
    (l) => {
      listeners.add(l);
      return () => listeners.delete(l);
    },
    () => state,
  );
}
