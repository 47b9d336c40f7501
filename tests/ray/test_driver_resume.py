"""Checkpoints through the driver: 4 steps in one run and 2 + 2 resumed (a second driver loading that run's
checkpoint after 2 steps) end with the same weights and the same data position (buffer of over-sampling
surplus and interrupted partial samples included, and the reference model that ref-update-interval moves);
async saves with rotation keep only the interval checkpoints and the newest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from runtime import driver
from runtime.train.checkpoint import (
    iteration_dir,
    list_iterations,
    read_latest_iteration,
    write_latest_iteration,
)
from tests.ray.conftest import read_metrics, read_reports

pytestmark = pytest.mark.ray


def _spec(artifacts: dict[str, Path], save: Path, **overrides) -> dict:
    spec = {
        "train-backend": "torch",
        "hf-checkpoint": str(artifacts["warm"]),
        "prompt-data": str(artifacts["train_small"]),
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-shuffle": True,
        "rollout-batch-size": 4,
        "n-samples-per-prompt": 4,
        "over-sampling-batch-size": 6,
        "dynamic-sampling-filter-path": "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std",
        "partial-rollout": True,
        "mask-offpolicy-in-partial-rollout": True,
        "rollout-max-response-len": 8,
        "global-batch-size": 16,
        "micro-batch-size": 16,
        "lr": 2e-3,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
        # the KL reference follows the policy every step: a resume must bring it back too
        "ref-load": str(artifacts["warm"]),
        "use-kl-loss": True,
        "kl-loss-coef": 0.05,
        "kl-loss-type": "low_var_kl",
        "ref-update-interval": 1,
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": str(save),
        "save-interval": 2,
    }
    spec.update(overrides)
    return spec


def _run(tmp_path: Path, name: str, spec: dict) -> Path:
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps({"name": name, "spec": spec}))
    report = tmp_path / f"report-{name}"
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 0
    return report


def test_four_steps_equal_two_plus_two_resumed(ray_local, artifacts: dict[str, Path], tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    report_a = _run(
        tmp_path,
        "whole",
        _spec(artifacts, whole, **{"num-rollout": 4, "async-save": True, "rotate-ckpt": True}),
    )
    # The second driver starts from a copy of the whole run's iteration 1 alone, `latest` pointing at it, as a
    # run stopped after 2 rollouts leaves it (a third driver that ran those 2 rollouts cost ~25 s of the suite
    # on two busy cores and checked nothing the copy does not; tests/ray/test_megatron_backend.py does the same)
    split = tmp_path / "split"
    split.mkdir()
    shutil.copytree(iteration_dir(whole, 1), iteration_dir(split, 1))
    write_latest_iteration(split, 1)
    assert read_latest_iteration(split) == 1
    report_b = _run(
        tmp_path, "second-half", _spec(artifacts, split, **{"num-rollout": 4, "load": str(split)})
    )

    a, b = iteration_dir(whole, 3), iteration_dir(split, 3)
    weights_a, weights_b = (
        load_file(a / "model" / "model.safetensors"),
        load_file(b / "model" / "model.safetensors"),
    )
    assert weights_a.keys() == weights_b.keys()
    worst = max(float((weights_a[k] - weights_b[k]).abs().max()) for k in weights_a)
    assert worst < 1e-6, worst
    moved = max(
        float((weights_a[k] - v).abs().max())
        for k, v in load_file(artifacts["warm"] / "model.safetensors").items()
    )
    assert moved > 1e-4  # training did change the weights
    state_a = json.loads((a / "trainer_state.json").read_text())["extra"]["data"]
    state_b = json.loads((b / "trainer_state.json").read_text())["extra"]["data"]
    assert (
        state_a == state_b and state_a["next_group_index"] > 4 * 4
    )  # over-sampling drew more than 4 x 4 groups

    metrics_a, metrics_b = read_metrics(report_a), read_metrics(report_b)
    assert sorted(metrics_b["rollout/reward"]) == [2, 3]  # the resumed run started at step 2
    for step in (2, 3):
        assert metrics_a["rollout/reward"][step] == metrics_b["rollout/reward"][step]
    assert any(k.startswith("rollout/oversampling/") for k in metrics_a)

    # rotation with async saves: every step was saved, only the interval ones and the newest stay
    assert list_iterations(whole) == [1, 3] and read_latest_iteration(whole) == 3
    reports = read_reports(report_a)
    saved = sorted(c["step"] for r in reports for c in r["checkpoints"] if c["format"] == "torch")
    assert saved == [0, 1, 2, 3]
    removed = [e["message"] for r in reports for e in r["events"] if e["kind"] == "checkpoint_removed"]
    assert sorted(Path(m).name for m in removed) == ["iter_0000000", "iter_0000002"]
