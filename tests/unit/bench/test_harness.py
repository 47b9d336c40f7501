"""bench.harness.environ: the values set for the block, each name's earlier state restored after."""

from __future__ import annotations

import os

import pytest

from bench.harness import environ


def test_environ_sets_then_restores_and_removes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAX_TEST_KEPT", "before")
    monkeypatch.delenv("RELAX_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError), environ({"RELAX_TEST_KEPT": "during", "RELAX_TEST_NEW": "x"}):
        assert os.environ["RELAX_TEST_KEPT"] == "during"
        assert os.environ["RELAX_TEST_NEW"] == "x"
        raise RuntimeError("the block fails: the environment is restored all the same")
    assert os.environ["RELAX_TEST_KEPT"] == "before"
    assert "RELAX_TEST_NEW" not in os.environ


def test_environ_of_nothing_changes_nothing() -> None:
    before = dict(os.environ)
    with environ({}):
        assert dict(os.environ) == before
    assert dict(os.environ) == before
