// Drives the dashboard in Debian's Chromium (playwright-core, no downloaded browser) against a
// running platform, the way a person would: sign in, submit a bad spec and read its field error,
// submit a good one, watch a metric chart and a log line arrive live, cancel, see CANCELLED.
//
//   RELAX_URL=http://127.0.0.1:8400 RELAX_API_KEY=... E2E_OUT=/tmp/shots node tests/e2e.mjs
//
// Env: RELAX_URL, RELAX_API_KEY (an admin key), E2E_OUT (screenshots; default a temp dir),
// CHROMIUM (default /usr/bin/chromium), E2E_NUM_ROLLOUT (default 600: long enough to cancel while
// it runs; it is cancelled after a few steps anyway). Prints one JSON line with what it saw; exits
// non-zero on the first failed step, after a screenshot named failure.png.
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";
import { chromium } from "playwright-core";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, "..", "..");
const URL_ = (process.env.RELAX_URL ?? "http://127.0.0.1:8400").replace(/\/$/, "");
const KEY = process.env.RELAX_API_KEY;
const OUT = process.env.E2E_OUT ?? mkdtempSync(join(tmpdir(), "relax-e2e-"));
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const NUM_ROLLOUT = Number(process.env.E2E_NUM_ROLLOUT ?? 600);
if (!KEY) {
  console.error("RELAX_API_KEY is required");
  process.exit(2);
}
mkdirSync(OUT, { recursive: true });

/**
 * examples/grpo-arith.yaml, made small: the tiny model (in place of the SFT job's export it starts
 * from), small batches, no eval or saving.
 */
function goodSpec(name) {
  const doc = yaml.load(readFileSync(join(ROOT, "examples", "grpo-arith.yaml"), "utf8"));
  const spec = {};
  for (const [k, v] of Object.entries(doc.spec)) {
    spec[k] = typeof v === "string" && v.startsWith("job://") ? "artifacts://models/tiny" : v;
  }
  for (const k of ["eval-interval", "eval-prompt-data", "eval-temperature", "save", "save-interval", "save-hf"]) delete spec[k];
  Object.assign(spec, {
    "hf-checkpoint": "artifacts://models/tiny",
    "rollout-batch-size": 4,
    "n-samples-per-prompt": 4,
    "global-batch-size": 16,
    "micro-batch-size": 16,
    "num-rollout": NUM_ROLLOUT,
  });
  return yaml.dump({ name, spec }, { lineWidth: 120, flowLevel: 2 });
}

/** The same document with a misspelled parameter: the API must name it and suggest the right one. */
function badSpec(name) {
  return goodSpec(name).replace("rollout-batch-size:", "rollout-batch-sise:");
}

const seen = { screenshots: [], steps: [] };
const t0 = Date.now();
function step(name) {
  seen.steps.push({ step: name, at_s: Number(((Date.now() - t0) / 1000).toFixed(1)) });
  console.error(`[e2e ${((Date.now() - t0) / 1000).toFixed(1)}s] ${name}`);
}

const profile = mkdtempSync(join(tmpdir(), "relax-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
  viewport: { width: 1440, height: 1000 },
});
const page = context.pages()[0] ?? (await context.newPage());
page.setDefaultTimeout(20_000);
const consoleErrors = [];
page.on("console", (m) => {
  if (m.type() === "error") consoleErrors.push(m.text());
});
page.on("pageerror", (e) => consoleErrors.push(String(e)));

async function shot(name) {
  const path = join(OUT, `${name}.png`);
  // From the top: a full-page capture draws the sticky header where the page was scrolled to.
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path, fullPage: true });
  seen.screenshots.push(path);
}

async function setEditor(text) {
  const editor = page.locator("#spec-editor");
  await editor.fill(text);
}

let jobId = null;
try {
  // 1. Signed out, a wrong key is refused with the API's message; the right one signs in.
  step("sign in");
  await page.goto(`${URL_}/#/jobs`);
  await page.getByLabel("API key").fill("rlx_not_a_real_key");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByText("This key is not valid.").waitFor();
  if (await page.getByText("The API rejected this key").count()) throw new Error("a refused sign-in shows the 401 notice");
  await shot("01-signin-refused");
  await page.getByLabel("API key").fill(KEY);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Jobs" }).waitFor();

  // 2. A key handed over in the URL (as a CLI would) signs in and leaves the address bar.
  step("sign in from #key=");
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key").waitFor();
  await page.goto(`${URL_}/#key=${encodeURIComponent(KEY)}`);
  await page.getByRole("heading", { name: "Jobs" }).waitFor();
  if (page.url().includes(KEY)) throw new Error(`the key is still in the address bar: ${page.url()}`);

  // 2b. `relaxctl dashboard`'s link: a one-time login code, exchanged once for a session key; the code
  // leaves the address bar, and a second use of the same link is refused.
  step("sign in from a one-time #code=");
  const issued = await fetch(`${URL_}/v1/auth/login-codes`, { method: "POST", headers: { Authorization: `Bearer ${KEY}` } });
  if (issued.status !== 201) throw new Error(`login code: HTTP ${issued.status}`);
  const { code } = await issued.json();
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key").waitFor();
  await page.goto(`${URL_}/#code=${encodeURIComponent(code)}`);
  await page.getByRole("heading", { name: "Jobs" }).waitFor();
  if (page.url().includes(code)) throw new Error(`the login code is still in the address bar: ${page.url()}`);
  const sessionKey = await page.evaluate(() => window.localStorage.getItem("relax.apiKey"));
  if (!sessionKey || sessionKey === KEY || !sessionKey.startsWith("rlx_")) throw new Error("no session key of its own after the code");
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.goto(`${URL_}/#code=${encodeURIComponent(code)}`);
  await page.getByText("This sign-in link was used already").waitFor();
  await page.goto(`${URL_}/#key=${encodeURIComponent(KEY)}`);
  await page.getByRole("heading", { name: "Jobs" }).waitFor();

  // 3. A stored key that the API now rejects (revoked) returns to sign-in and says why.
  step("a rejected key returns to sign-in");
  await page.evaluate(() => window.localStorage.setItem("relax.apiKey", "rlx_revoked_key"));
  await page.reload();
  await page.getByText("The API rejected this key").waitFor();
  await page.goto(`${URL_}/#key=${encodeURIComponent(KEY)}`);
  await page.getByRole("heading", { name: "Jobs" }).waitFor();

  // 4. A bad spec: validation and submit both name the field and give the hint.
  step("submit an invalid spec");
  const name = `e2e-${Date.now().toString(36)}`;
  await page.getByRole("link", { name: "Submit", exact: true }).click();
  await page.getByRole("heading", { name: "Submit a job" }).waitFor();
  await setEditor(badSpec(name));
  await page.getByRole("button", { name: "Validate" }).click();
  await page.locator('[data-testid="validation"] [data-field="rollout-batch-sise"]').waitFor();
  await page.getByRole("button", { name: "Submit", exact: true }).click();
  const issue = page.locator('[data-testid="error-panel"] [data-field="rollout-batch-sise"]');
  await issue.waitFor();
  const issueText = await issue.innerText();
  if (!issueText.includes("did you mean --rollout-batch-size")) throw new Error(`no hint in the field error: ${issueText}`);
  const requestId = await page.locator('[data-testid="error-panel"] .request-id code').innerText();
  seen.invalid = { field_issue: issueText.replace(/\s+/g, " "), request_id: requestId };
  await shot("02-submit-invalid");

  // 5. A good spec validates (demand shown) and submits; the page moves to the new job.
  step("submit a valid spec");
  await setEditor(goodSpec(name));
  await page.getByRole("button", { name: "Validate" }).click();
  await page.getByText("Valid.", { exact: false }).waitFor();
  await page.locator('[data-testid="demand-total"]').waitFor();
  await shot("03-validate-ok");
  await page.getByRole("button", { name: "Submit", exact: true }).click();
  await page.waitForURL(/#\/jobs\/job_/);
  jobId = decodeURIComponent(page.url().split("#/jobs/")[1].split(/[/?]/)[0]);
  seen.job_id = jobId;
  await page.getByRole("heading", { name }).waitFor();

  // 6. Live: a metric chart, then a log line, arrive without reloading the page.
  step("wait for a metric chart");
  // A job that ends first (e.g. it could not launch) fails the test at once, with its reason.
  const ended = page.locator(".page-head .status", { hasText: /^(SUCCEEDED|FAILED|CANCELLED)$/ });
  await page.locator('[data-testid="metric-chart"]').first().or(ended).waitFor({ timeout: 150_000 });
  if (await ended.count()) {
    const why = await page.locator(".error-panel").first().innerText().catch(() => "");
    throw new Error(`the job ended (${await ended.innerText()}) before any metric arrived: ${why}`);
  }
  seen.first_metric = await page.locator('[data-testid="metric-chart"]').first().getAttribute("data-metric");
  await page.waitForTimeout(1500); // let a few more points arrive before the screenshot
  await shot("04-job-metrics");
  step("wait for a log line");
  await page.getByRole("tab", { name: /Logs/ }).click();
  await page.locator('[data-testid="log-line"]').first().waitFor({ timeout: 60_000 });
  seen.log_lines = await page.locator('[data-testid="log-line"]').count();
  await shot("05-job-logs");
  await page.getByRole("tab", { name: /Events/ }).click();
  await page.locator('[data-testid="events"] li').first().waitFor();
  await shot("06-job-events");

  // 7. Cancel, confirmed in the dialog; the page follows the job to CANCELLED.
  step("cancel");
  const status = page.locator(".page-head .status");
  seen.status_before_cancel = await status.innerText();
  if (["SUCCEEDED", "FAILED", "CANCELLED"].includes(seen.status_before_cancel)) {
    throw new Error(`the job ended (${seen.status_before_cancel}) before it could be cancelled`);
  }
  await page.getByRole("button", { name: "Cancel job" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Cancel job" }).click();
  await page.locator(".page-head .status", { hasText: /^CANCELLED$/ }).waitFor({ timeout: 90_000 });
  await shot("07-job-cancelled");

  // 8. The list and the capacity pages render the same job and the pool.
  step("jobs list and pools");
  await page.getByRole("link", { name: "Jobs", exact: true }).click();
  await page.locator(`[data-testid="jobs-table"] tr[data-job-id="${jobId}"]`).waitFor();
  await shot("08-jobs-list");
  await page.getByRole("link", { name: "Pools & queues" }).click();
  await page.locator('[data-testid="pool"]').first().waitFor();
  await page.locator('[data-testid="queues"]').waitFor();
  await shot("09-pools-queues");

  seen.console_errors = consoleErrors.filter((e) => !/401|422|Failed to load resource/.test(e));
  step("done");
  console.log(JSON.stringify({ ok: true, ...seen }));
} catch (err) {
  await shot("failure").catch(() => undefined);
  console.log(JSON.stringify({ ok: false, error: String(err?.stack ?? err), ...seen, console_errors: consoleErrors }));
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
