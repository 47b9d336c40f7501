// The API key the dashboard signs in with: kept in localStorage, dropped on a 401.
import { useSyncExternalStore } from "react";
import { navigate, takeKeyFromHash } from "./router";

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

/** `#key=<key>` in the address: sign in with it once, and take it out of the address bar and history. */
export function adoptKeyFromLocation(): void {
  const { key, rest } = takeKeyFromHash(window.location.hash);
  if (!key) return;
  signIn(key);
  navigate(rest, { replace: true });
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
