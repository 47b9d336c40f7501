"""Architecture and hygiene checks that make `make test` fail when a rule of the codebase breaks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_import_rules_hold() -> None:
    """api -> scheduler -> jobspec; runtime never imports api/scheduler; jobspec stays pure (pyproject)."""
    r = subprocess.run([str(BIN / "lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_ruff_is_clean() -> None:
    r = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
