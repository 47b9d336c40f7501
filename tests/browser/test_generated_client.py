"""The dashboard's generated API types (web/src/api/gen) match the API as it is now."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.browser._web import WEB, missing_for_unit_tests


def test_openapi_snapshot_matches_the_api(relax_home: Path) -> None:
    """gen/openapi.json is what create_app().openapi() returns; if not, `cd web && npm run gen-api`."""
    from api.app import create_app

    live = json.loads(json.dumps(create_app().openapi(), sort_keys=True))
    committed = json.loads((WEB / "src" / "api" / "gen" / "openapi.json").read_text())
    if live != committed:
        changed = sorted(
            set(live.get("paths", {})) ^ set(committed.get("paths", {}))
            | {
                name
                for name in set(live["components"]["schemas"]) | set(committed["components"]["schemas"])
                if live["components"]["schemas"].get(name) != committed["components"]["schemas"].get(name)
            }
        )
        pytest.fail(
            "web/src/api/gen is out of date with the API (differs in: "
            f"{', '.join(changed) or 'paths or metadata'}): run `cd web && npm run gen-api` and commit the result"
        )


def test_web_unit_tests() -> None:
    """The dashboard's vitest suite: SSE parser, query keys, formatting, live-data merging."""
    reason = missing_for_unit_tests()
    if reason:
        pytest.skip(reason)
    r = subprocess.run(["npm", "test", "--silent"], cwd=WEB, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
