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
