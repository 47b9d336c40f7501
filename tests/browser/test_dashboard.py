"""The dashboard in a real browser against the real embedded platform: sign in, a refused spec with
its field error, a submitted GRPO job whose metrics and logs arrive live, cancel, CANCELLED.

The browser part is web/tests/e2e.mjs (playwright-core driving Debian's Chromium); screenshots land
in this test's tmp dir and their paths are printed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.harness import RunningPlatform, start_platform, stop_platform
from tests.browser._web import CHROMIUM, WEB, missing_for_browser, node

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def platform():  # type: ignore[no-untyped-def]
    reason = missing_for_browser()
    if reason:
        pytest.skip(reason)
    # A short home: Ray puts unix sockets under it, and their paths must stay under 108 bytes
    # (pytest's tmp dirs are long enough to break that).
    home = Path(tempfile.mkdtemp(prefix="relax-ui-"))
    p = start_platform(home / "home")
    try:
        r = p.relaxctl("models", "tiny", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        yield p
    finally:
        stop_platform(p)
        shutil.rmtree(home, ignore_errors=True)


def test_dashboard_submit_watch_cancel(platform: RunningPlatform, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    env = os.environ | {
        "RELAX_URL": platform.url,
        "RELAX_API_KEY": platform.key,
        "E2E_OUT": str(shots),
        "CHROMIUM": CHROMIUM,
    }
    r = subprocess.run(
        [node() or "node", "tests/e2e.mjs"], cwd=WEB, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": "no result line"}
    print(f"screenshots: {shots}")
    for path in result.get("screenshots", []):
        print(f"  {path}")
    assert r.returncode == 0 and result["ok"], (
        f"{result.get('error')}\nsteps: {result.get('steps')}\n--- e2e stderr\n{r.stderr[-4000:]}\n"
        f"--- platform\n{platform.log()}"
    )
    # What the run saw, beyond "it did not fail".
    assert "rollout-batch-sise" in result["invalid"]["field_issue"]
    assert result["invalid"]["request_id"]
    assert result["first_metric"].split("/")[0] in {"rollout", "train", "eval", "perf"}
    assert result["log_lines"] >= 1
    assert result["status_before_cancel"] in {"STARTING", "RUNNING"}
    assert result["console_errors"] == [], result["console_errors"]
    assert {Path(p).name for p in result["screenshots"]} >= {"02-submit-invalid.png", "07-job-cancelled.png"}
