// Sign in with an API key: it is checked against the API before it is kept.
import { type FormEvent, useState } from "react";
import { api, ApiError, unwrap } from "../api/client";
import { ErrorPanel } from "../components/common/ErrorPanel";
import { signIn } from "../lib/auth";

export function SignInPage({ notice }: { notice: string | null }) {
  const [key, setKey] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);

  const onSubmit = async (e: FormEvent) => {
    e.preventDefault();
    const k = key.trim();
    if (!k) return;
    setBusy(true);
    setError(null);
    try {
      // A cheap authenticated call, signed with the candidate key rather than the stored one.
      await unwrap(api.GET("/v1/queues", { headers: { Authorization: `Bearer ${k}` } }), { signOutOn401: false });
      signIn(k);
    } catch (err) {
      setError(err instanceof ApiError && err.status === 401 ? new ApiError(401, err.code, "This key is not valid.", null, err.requestId) : err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <main id="main" className="signin">
      <div className="panel">
        <h1 style={{ marginBottom: 6 }}>Relax Platform</h1>
        <p className="muted" style={{ marginTop: 0 }}>
          Sign in with an API key. On the machine that runs the platform, the admin key is in <code>.relax/admin.key</code>.{" "}
          <code>relaxctl dashboard</code> opens this page signed in, with a one-time link.
        </p>
        {notice ? (
          <div className="warn-panel" role="status" style={{ marginBottom: 12 }}>
            {notice}
          </div>
        ) : null}
        <form onSubmit={onSubmit}>
          <label className="field" htmlFor="api-key">
            API key
          </label>
          <input
            id="api-key"
            type="password"
            autoComplete="current-password"
            value={key}
            onChange={(e) => setKey(e.target.value)}
            placeholder="rlx_…"
            autoFocus
            required
          />
          <button type="submit" className="primary" disabled={busy || !key.trim()}>
            {busy ? "Checking…" : "Sign in"}
          </button>
          <ErrorPanel error={error} title="Sign-in failed" />
        </form>
      </div>
    </main>
  );
}
