"""Experiment trackers (runtime/trackers.py): every metric point the reporter queues for the platform is also in
the job's TensorBoard event files (and in W&B's offline run with --use-wandb), where the spec's flags say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.reporter import LocalReporter
from runtime.trackers import open_trackers, tracker_plan, wandb_installed

pytest.importorskip("tensorboard")  # in relax-platform[runtime]
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def read_scalars(directory: Path) -> dict[tuple[int, str], float]:
    """(step, tag) -> value of every scalar in the event files of `directory`, as TensorBoard reads them."""
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def stored_points(report_dir: Path) -> dict[tuple[int, str], float]:
    lines = (report_dir / "metrics.jsonl").read_text().splitlines()
    return {(m["step"], m["name"]): m["value"] for m in map(json.loads, lines)}


def _run(
    report_dir: Path, values: dict[str, Any], points: dict[int, dict[str, float]], start: int = 0
) -> Any:
    reporter = LocalReporter(report_dir, stream=open("/dev/null", "w"))  # noqa: SIM115 - closed with the process
    sink = open_trackers(values, output_dir=report_dir.parent, run_name="job-a", start_step=start)
    reporter.add_sink(sink)
    for step, metrics in points.items():
        reporter.metrics(step, metrics)
    sink.close()
    reporter.close(timeout=10)
    return sink


POINTS = {
    0: {"train/loss": 2.5, "rollout/reward": 0.125},
    1: {"train/loss": 1.75, "rollout/reward": 0.375, "perf/step_time": 0.3333333333},
    2: {"train/loss": 1.0, "eval/arith": 0.5},
}


def test_every_point_the_reporter_queues_is_in_the_event_files(tmp_path: Path) -> None:
    """Default flags (--use-tensorboard is on): `<output>/tensorboard/<run name>/events.out.tfevents.*`, and
    the scalars TensorBoard reads back are the points the platform got (float32, as TensorBoard stores them)."""
    sink = _run(tmp_path / "report", {}, POINTS)
    folder = tmp_path / "tensorboard" / "job-a"
    assert sink.plan.tensorboard == folder
    assert [p.name.startswith("events.out.tfevents.") for p in folder.iterdir()] == [True]
    stored = stored_points(tmp_path / "report")
    assert len(stored) == 7
    assert read_scalars(folder) == pytest.approx(stored, rel=1e-6)


def test_tb_flags_name_the_folder_and_no_use_tensorboard_writes_none(tmp_path: Path) -> None:
    values = {"tb_project_name": str(tmp_path / "tb"), "tb_experiment_name": "exp-1"}
    _run(tmp_path / "report", values, POINTS)
    assert read_scalars(tmp_path / "tb" / "exp-1")[(1, "train/loss")] == 1.75
    _run(tmp_path / "report2", {"use_tensorboard": False}, POINTS)
    assert not (tmp_path / "tensorboard").exists()
    plan = tracker_plan({}, output_dir=tmp_path, run_name="j", env={"TENSORBOARD_DIR": "/data/tb"})
    assert plan.tensorboard == Path("/data/tb/j")  # Relax's default: $TENSORBOARD_DIR


def test_a_resumed_attempt_purges_the_steps_it_redoes(tmp_path: Path) -> None:
    """The first attempt reached step 2, its checkpoint was step 0: the second attempt starts at 1 and
    redoes 1 and 2; TensorBoard shows each step once, with the second attempt's values."""
    _run(tmp_path / "report", {}, POINTS)
    _run(tmp_path / "report", {}, {1: {"train/loss": 9.0}, 2: {"train/loss": 8.0}}, start=1)
    scalars = read_scalars(tmp_path / "tensorboard" / "job-a")
    losses = {step: v for (step, tag), v in scalars.items() if tag == "train/loss"}
    assert losses == {0: 2.5, 1: 9.0, 2: 8.0}


def test_wandb_flags_make_the_runs_arguments() -> None:
    values = {
        "use_wandb": True,
        "wandb_project": "p",
        "wandb_team": "t",
        "wandb_group": "g",
        "wandb_exp_name": "e",
        "wandb_mode": "offline",
        "wandb_dir": "/w",
    }
    plan = tracker_plan(values, output_dir="/out", run_name="job", env={}, suffix="x1")
    assert plan.wandb == {
        "project": "p",
        "entity": "t",
        "group": "g",
        "name": "e_x1",
        "id": None,
        "resume": None,
        "dir": "/w",
        "mode": "offline",
    }
    plain = tracker_plan(
        {"use_wandb": True, "wandb_random_suffix": False},
        output_dir="/out",
        run_name="job",
        env={"WANDB_MODE": "offline"},
    ).wandb
    assert plain is not None
    assert (plain["project"], plain["name"], plain["dir"], plain["mode"]) == (
        "relax",
        "job",
        "/out/wandb",
        "offline",
    )
    assert tracker_plan({}, output_dir="/out", run_name="job").wandb is None


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline run's `.wandb` file (what `wandb sync` uploads): LevelDB's log format (32 KiB
    blocks of records with a 7-byte header: crc, length, type full/first/middle/last) after W&B's 7-byte file
    header, each record a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data, records, chunks, pos = path.read_bytes(), [], b"", 7
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:
            pos += left
            continue
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


@pytest.mark.skipif(
    not wandb_installed(), reason="wandb (the optional extra relax-platform[wandb]) is not installed"
)
def test_wandb_offline_run_gets_every_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    values = {
        "use_wandb": True,
        "wandb_mode": "offline",
        "wandb_project": "relax-test",
        "use_tensorboard": False,
    }
    sink = _run(tmp_path / "report", values, POINTS)
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and sink.plan.wandb["name"].startswith("job-a_")
    logged: dict[tuple[int, str], float] = {}
    for record in wandb_records(next(runs[0].glob("*.wandb"))):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = int(items.pop("_step"))
            logged |= {(step, k): v for k, v in items.items() if not k.startswith("_")}
    assert logged == stored_points(tmp_path / "report")


def test_use_wandb_is_refused_at_submission_where_wandb_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The platform's processes and its clusters share one install: without the extra, `--use-wandb` is refused
    by name with the hint, before any GPU is spent (the suite installs the extra: its absence is simulated)."""
    from runtime import capabilities
    from scheduler.services.submission import backend_refusals

    values = {"train_backend": "torch", "use_wandb": True}
    assert backend_refusals(values) == []
    monkeypatch.setattr(capabilities, "wandb_installed", lambda: False)
    [issue] = backend_refusals(values)
    assert issue["code"] == "spec.unsupported_by_backend" and issue["field"] == "use-wandb"
    assert "relax-platform[wandb]" in issue["hint"]
