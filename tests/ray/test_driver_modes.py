"""Modes through the driver: fully-async within max-staleness; debug-rollout-only saving its rollouts (with
over-sampling, the dynamic filter, partial rollout and pass@k eval) and debug-train-only training on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime import driver
from runtime.train.checkpoint import read_latest_iteration
from tests.ray.conftest import read_metrics, read_reports

pytestmark = pytest.mark.ray

FILTER = "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std"


def _base(artifacts: dict[str, Path]) -> dict:
    return {
        "train-backend": "torch",
        "hf-checkpoint": str(artifacts["warm"]),
        "prompt-data": str(artifacts["train_small"]),
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-shuffle": True,
        "rollout-batch-size": 4,
        "n-samples-per-prompt": 4,
        "rollout-max-response-len": 8,
        "global-batch-size": 16,
        "micro-batch-size": 16,
        "lr": 2e-3,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
    }


def _run(tmp_path: Path, name: str, spec: dict) -> Path:
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps({"name": name, "spec": spec}))
    report = tmp_path / f"report-{name}"
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 0
    return report


def test_fully_async_stays_within_max_staleness(
    ray_local, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    spec = {
        **_base(artifacts),
        "fully-async": True,
        "max-staleness": 2,
        "num-rollout": 6,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": str(tmp_path / "ckpt"),
    }
    report = _run(tmp_path, "async", spec)
    metrics = read_metrics(report)
    assert sorted(metrics["train/loss"]) == list(range(6))
    staleness = metrics["rollout/staleness/max"]
    assert max(staleness.values()) <= 2 and max(staleness.values()) >= 1  # it did run ahead, never too far
    assert max(metrics["rollout/ahead_of_trainer"].values()) <= 2
    for step in range(6):
        records = [
            json.loads(line)
            for line in (tmp_path / "ckpt" / "rollout_result" / "train" / f"{step}.jsonl")
            .read_text()
            .splitlines()
        ]
        assert all(step - min(r["weight_versions"]) <= 2 for r in records)
    assert read_latest_iteration(tmp_path / "ckpt") == 5


def test_debug_rollout_only_saves_rollouts_that_debug_train_only_trains_on(
    ray_local, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    debug = tmp_path / "debug" / "rollout_{rollout_id}.pt"
    rollout_only = {
        **_base(artifacts),
        "debug-rollout-only": True,
        "num-rollout": 2,
        "over-sampling-batch-size": 8,
        "dynamic-sampling-filter-path": FILTER,
        "partial-rollout": True,
        "resource": {"rollout": [1, 1]},
        "save": str(tmp_path / "gen"),
        "save-debug-rollout-data": str(debug),
        "eval-interval": 1,
        "eval-prompt-data": ["small", str(artifacts["train_small"])],
        "n-samples-per-eval-prompt": 4,
        "log-passrate": True,
        "eval-max-response-len": 8,
    }
    report = _run(tmp_path, "rollout-only", rollout_only)
    metrics = read_metrics(report)
    assert not any(name.startswith("train/") for name in metrics)
    assert {
        "eval/small",
        "eval/small-pass@1",
        "eval/small-pass@2",
        "eval/small-pass@4",
        "eval/small-truncated_ratio",
    } <= set(metrics)
    assert sorted(metrics["eval/small"]) == [0, 1, 2]
    assert metrics["eval/small-pass@4"][0] >= metrics["eval/small-pass@1"][0]
    assert "rollout/oversampling/groups_submitted" in metrics
    eval_rows = [
        json.loads(x)
        for x in (tmp_path / "gen" / "rollout_result" / "eval" / "0.jsonl").read_text().splitlines()
    ]
    assert len(eval_rows) == 16 * 4 and {r["dataset"] for r in eval_rows} == {"small"}
    assert all((tmp_path / "debug" / f"rollout_{i}.pt").is_file() for i in (0, 1))
    assert read_latest_iteration(tmp_path / "gen") is None  # no trainer, no checkpoint

    train_only = {
        **_base(artifacts),
        "load-debug-rollout-data": str(debug),
        "load-debug-rollout-data-subsample": 0.5,
        "num-rollout": 2,
        "resource": {"actor": [1, 1]},
        "save": str(tmp_path / "trained"),
    }
    del train_only["prompt-data"]
    report = _run(tmp_path, "train-only", train_only)
    metrics = read_metrics(report)
    assert sorted(metrics["train/loss"]) == [0, 1]
    assert read_latest_iteration(tmp_path / "trained") == 1
    trained_rows = [
        json.loads(x)
        for x in (tmp_path / "trained" / "rollout_result" / "train" / "0.jsonl").read_text().splitlines()
    ]
    assert len(trained_rows) == 2 * 4  # half of the 4 saved groups
    events = [e["kind"] for r in read_reports(report) for e in r["events"]]
    assert "finished" in events
