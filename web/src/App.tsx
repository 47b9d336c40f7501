// The shell: sign-in gate, top navigation and the hash routes.
import { useQueryClient } from "@tanstack/react-query";
import { useEffect } from "react";
import { getApiKey, signOut, useAuth } from "./lib/auth";
import { useRoute } from "./lib/router";
import { EvalsPage } from "./routes/EvalsPage";
import { JobDetailPage } from "./routes/JobDetailPage";
import { JobsPage } from "./routes/JobsPage";
import { PlatformPage } from "./routes/PlatformPage";
import { SignInPage } from "./routes/SignInPage";
import { SubmitPage } from "./routes/SubmitPage";

const NAV = [
  { section: "jobs", href: "#/jobs", label: "Jobs" },
  { section: "submit", href: "#/submit", label: "Submit" },
  { section: "evals", href: "#/evals", label: "Evals" },
  { section: "platform", href: "#/platform", label: "Pools & queues" },
];

const TITLES: Record<string, string> = { jobs: "Jobs", submit: "Submit", evals: "Evals", platform: "Pools & queues" };

export function App() {
  const auth = useAuth();
  const route = useRoute();
  const qc = useQueryClient();
  const [section = "jobs", id, tab] = route.path;

  useEffect(() => {
    document.title = `${id && section === "jobs" ? id : (TITLES[section] ?? "Relax")} · Relax Platform`;
  }, [section, id]);

  // Another key, another view of the platform: drop everything cached under the previous one.
  useEffect(() => {
    if (!auth.key) qc.clear();
  }, [auth.key, qc]);

  if (!auth.key) return <SignInPage notice={auth.notice} />;

  let page;
  if (section === "jobs" && id) page = <JobDetailPage key={id} jobId={id} tab={tab} />;
  else if (section === "submit") page = <SubmitPage route={route} />;
  else if (section === "evals") page = <EvalsPage route={route} />;
  else if (section === "platform") page = <PlatformPage />;
  else page = <JobsPage route={route} />;

  const keyHint = getApiKey()?.slice(0, 8) ?? "";
  return (
    <>
      <a className="skip-link" href="#main" onClick={(e) => {
        e.preventDefault();
        document.getElementById("main")?.focus();
      }}>
        Skip to content
      </a>
      <header className="topbar">
        <a className="brand" href="#/jobs">
          <span className="brand-mark" aria-hidden="true" /> Relax Platform
        </a>
        <nav className="nav" aria-label="Main">
          {NAV.map((n) => (
            <a key={n.section} href={n.href} aria-current={section === n.section || (n.section === "jobs" && !TITLES[section]) ? "page" : undefined}>
              {n.label}
            </a>
          ))}
        </nav>
        <div className="topbar-right">
          <a href="/docs" target="_blank" rel="noreferrer">
            API docs
          </a>
          <span title="The API key this dashboard signs with">
            key <code>{keyHint}…</code>
          </span>
          <button type="button" onClick={() => signOut(null)}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        {page}
      </main>
    </>
  );
}
