"""`relaxctl submit` / `relaxctl spec validate` with launch scripts, against a recording fake API client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import client.cli as cli
import client.commands as commands

SCRIPT = """#!/bin/bash
MODEL_ARGS=(--num-layers 2 --hidden-size 64)
python3 - <<'PY'
print("prepare data")
PY
pkill -9 python
python3 -m relax.entrypoints.train "${MODEL_ARGS[@]}" --seed "${SEED:-1}" "$@"
"""


class FakeClient:
    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = calls

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def pools(self) -> list[dict[str, Any]]:
        return [{"name": "p", "accelerator": "cpu"}]

    def validate_spec(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("validate", kw))
        return {
            "valid": True,
            "queue": "q",
            "pool": "p",
            "demand": {"summary": "1 GPU"},
            "warnings": [],
            "errors": [],
        }

    def submit_job(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("submit", kw))
        return {"id": "job_1", "name": kw["name"], "queue": "q", "pool": "p", "submitted": {}}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    recorded: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(commands, "connect", lambda url, key: FakeClient(recorded))
    return recorded


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "run-tiny.sh"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consoles wide enough that rich never wraps a long tmp path (pytest-xdist's are longer) mid-word."""
    monkeypatch.setattr(commands, "out", Console(width=400))
    monkeypatch.setattr(commands, "err", Console(stderr=True, width=400))


def invoke(*argv: str) -> Any:
    return CliRunner().invoke(cli.app, list(argv))


def text(result: Any) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_validate_runs_the_script_and_sends_its_flags(script: Path, calls: list) -> None:
    r = invoke(
        "spec", "validate", str(script), "--env", "SEED=5", "--env", "HF_TOKEN=t", "--", "--lr", "1e-6"
    )
    assert r.exit_code == 0, r.output
    ((kind, body),) = calls
    assert kind == "validate"
    assert body["args"] == ["--num-layers", "2", "--hidden-size", "64", "--seed", "5", "--lr", "1e-6"]
    ls = body["launch_script"]
    assert (ls["line"], ls["entrypoint"], ls["script_args"]) == (
        7,
        "python3 -m relax.entrypoints.train",
        ["--lr", "1e-6"],
    )
    assert ls["env"] == {"SEED": "5", "HF_TOKEN": "***"} and ls["text"] == SCRIPT and len(ls["sha256"]) == 64
    out = text(r)
    assert "run-tiny.sh: training command at line 7 (python3 -m relax.entrypoints.train" in out
    assert "not run: python3 - (a script on standard input) (line 3)" in out and "did nothing: pkill" in out
    assert "valid" in out


def test_validate_json_adds_the_resolved_script(script: Path, calls: list) -> None:
    r = invoke("spec", "validate", str(script), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["valid"] is True and data["launch_script"]["line"] == 7
    assert [s["what"] for s in data["launch_script"]["skipped"]] == ["python3 - (a script on standard input)"]
    assert data["launch_script"]["argv"][-2:] == ["--seed", "1"]


def test_submit_a_script(script: Path, calls: list) -> None:
    r = invoke("submit", str(script), "-e", "SEED=9", "--", "--colocate")
    assert r.exit_code == 0, r.output
    ((kind, body),) = calls
    assert kind == "submit" and body["name"] == "run-tiny"
    assert body["args"][-3:] == ["--seed", "9", "--colocate"] and body["launch_script"]["script_args"] == [
        "--colocate"
    ]
    assert "submitted job_1" in text(r)


def test_a_script_without_training_command_submits_nothing(tmp_path: Path, calls: list) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("set -e\ncd /nonexistent-relax-dir\npython3 train.py\n")
    for argv in (("submit", str(bad)), ("spec", "validate", str(bad))):
        r = invoke(*argv)
        assert r.exit_code == 2 and calls == []
        assert "bad.sh:2" in text(r) and "before reaching a training command" in text(r)


def test_flags_after_dashes_without_a_file_are_relax_flags(calls: list) -> None:
    r = invoke("submit", "--", "--rollout-batch-size", "8")
    assert r.exit_code == 0, r.output
    assert calls[0][1]["args"] == ["--rollout-batch-size", "8"] and calls[0][1]["launch_script"] is None


def test_job_files_take_no_script_arguments_or_env(tmp_path: Path, calls: list) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("rollout-batch-size: 8\n")
    assert invoke("submit", str(job), "--", "--seed", "1").exit_code == 2
    r = invoke("spec", "validate", str(job), "--env", "A=1")
    assert r.exit_code == 2 and "--env is for launch scripts" in text(r)
    assert calls == []
    assert invoke("spec", "validate", str(job)).exit_code == 0 and calls[0][1]["spec"] == {
        "rollout-batch-size": 8
    }


def test_sdk_submit_script_sends_flags_and_provenance(script: Path) -> None:
    import httpx

    from client.sdk import RelaxClient

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "job_2"})

    c = RelaxClient("http://relax.test", "key")
    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(handler))
    assert c.submit_script(script, env={"SEED": "4"}, script_args=["--x"], queue="q")["id"] == "job_2"
    (body,) = sent
    assert body["name"] == "run-tiny" and body["queue"] == "q" and body["args"][-3:] == ["--seed", "4", "--x"]
    assert body["launch_script"]["line"] == 7 and body["launch_script"]["env"] == {"SEED": "4"}


def test_help_shows_flags_without_a_value_type() -> None:
    """A flag takes no value: the help shows none for it (Typer's panel printed `<bool>`), and still shows the
    type of an option that takes one."""
    result = CliRunner().invoke(cli.app, ["submit", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    wait = next(line for line in lines if "--wait" in line)
    name = next(line for line in lines if "--name" in line)
    assert "<bool>" not in result.output and "<" not in wait
    assert "<str>" in name


class NamedJobsClient:
    """Speaks for an API holding three jobs: `sft-arith` once and `grpo` twice (a recording fake of the HTTP
    client, as FakeClient above)."""

    JOBS = [
        {"id": "job_0000000000010000000a", "name": "sft-arith", "status": "SUCCEEDED", "team": "t",
         "created_at": "2026-12-04T10:00:00Z"},
        {"id": "job_0000000000020000000b", "name": "grpo", "status": "RUNNING", "team": "t",
         "created_at": "2026-12-04T11:00:00Z"},
        {"id": "job_0000000000030000000c", "name": "grpo", "status": "QUEUED", "team": "t",
         "created_at": "2026-12-04T12:00:00Z"},
    ]  # fmt: skip

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def __enter__(self) -> NamedJobsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_jobs(self, name: str | None = None, limit: int = 50, **_: Any) -> dict[str, Any]:
        return {"data": [j for j in self.JOBS if j["name"] == name][:limit]}

    def metrics(self, job_id: str, names: list[str] | None = None) -> dict[str, Any]:
        self.asked.append(job_id)
        return {"train/loss": [{"step": 1, "value": 0.5}]}


def test_jobs_are_addressed_by_id_or_by_a_name_only_one_job_has(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(commands, "connect", lambda url, key: NamedJobsClient(asked))
    runner = CliRunner()
    assert runner.invoke(cli.app, ["metrics", "sft-arith"]).exit_code == 0
    assert runner.invoke(cli.app, ["metrics", "job_0000000000030000000c"]).exit_code == 0
    assert asked == ["job_0000000000010000000a", "job_0000000000030000000c"]

    ambiguous = runner.invoke(cli.app, ["metrics", "grpo"], env={"COLUMNS": "200"})
    assert ambiguous.exit_code == 2 and "2 jobs are named 'grpo'" in ambiguous.output
    assert "job_0000000000020000000b" in ambiguous.output and "job_0000000000030000000c" in ambiguous.output
    missing = runner.invoke(cli.app, ["metrics", "nope"])
    assert missing.exit_code == 2 and "no job has the id or name 'nope'" in missing.output
    assert asked == ["job_0000000000010000000a", "job_0000000000030000000c"]
