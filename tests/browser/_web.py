"""Where the dashboard's build and tools are, and why a browser test would have to skip."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def node() -> str | None:
    return shutil.which("node")


def missing_for_unit_tests() -> str | None:
    """Why the web unit tests cannot run here, or None."""
    if node() is None:
        return "node is not installed (the Makefile then skips the dashboard build too)"
    if not (WEB / "node_modules" / ".bin" / "vitest").exists():
        return "web/node_modules is missing: run `make web`"
    return None


def missing_for_browser() -> str | None:
    """Why the browser test cannot run here, or None."""
    reason = missing_for_unit_tests()
    if reason:
        return reason
    if not (WEB / "dist" / "index.html").exists():
        return "the dashboard is not built: run `make web`"
    if not (WEB / "node_modules" / "playwright-core").exists():
        return "playwright-core is not installed in web/node_modules: run `make web`"
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return f"no Chromium at {CHROMIUM} (`make browser` installs Debian's chromium)"
    return None
