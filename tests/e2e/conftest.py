"""The embedded platform the end-to-end tests run against: one per test module, with the tiny model."""

from __future__ import annotations

import pytest

from bench.harness import start_platform, stop_platform


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A fresh embedded platform in a temporary home, `relaxctl models tiny` done; stopped after the
    module, which must take under 45 s."""
    p = start_platform(tmp_path_factory.mktemp("platform") / "home")
    try:
        r = p.relaxctl("models", "tiny")
        assert r.returncode == 0, r.stdout + r.stderr
        yield p
    finally:
        took = stop_platform(p)
        assert took < 45, f"the platform took {took:.0f}s to stop"


def log_problems(client, job_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A job's log lines (every page) at level ERROR or above or carrying a traceback: a job that succeeds
    has none (issue 16: a successful GRPO job used to end with an ERROR traceback from its engine actor)."""
    bad: list[str] = []
    after = 0
    while True:
        page = client.logs(job_id, after=after, limit=1000)
        for line in page["data"]:
            if (
                line["level"] in ("ERROR", "CRITICAL")
                or "Traceback (most recent call last)" in line["message"]
            ):
                bad.append(f"{line['source']} {line['level']}: {line['message'][:500]}")
        if not page["data"] or page["next_after"] == after:
            return bad
        after = page["next_after"]
