"""An eval-only job through the driver (`runtime.eval.eval_only`: debug-rollout-only, start-rollout-id at
num-rollout, eval sets): the tiny model generates on every eval set, the math reward scores it, and the
`eval/*` metrics (pass@k with several samples) come out; no trainer, no training prompt read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime import driver
from runtime.eval import eval_only
from runtime.spec import RuntimeSpec
from tests.ray.conftest import read_metrics

pytestmark = pytest.mark.ray


def eval_spec(model: Path, test_set: Path, save: Path) -> dict:
    return {
        "train-backend": "torch",
        "hf-checkpoint": str(model),
        "debug-rollout-only": True,
        "num-rollout": 1,
        "start-rollout-id": 1,
        "prompt-data": str(save / "never-read.jsonl"),  # an eval-only job reads no training prompt
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-batch-size": 1,
        "rollout-max-response-len": 8,
        "eval-prompt-data": ["arith", str(test_set)],
        "n-samples-per-eval-prompt": 4,
        "log-passrate": True,
        "eval-temperature": 1.0,
        "resource": {"rollout": [1, 1]},
        "save": str(save),
    }


def test_the_mode_is_relax_s_run_with_no_rollout_left() -> None:
    base = dict(debug_rollout_only=True, num_rollout=1, start_rollout_id=1, eval_prompt_data=["a", "/a"])
    assert eval_only(RuntimeSpec(**base))
    assert not eval_only(RuntimeSpec(**{**base, "start_rollout_id": 0}))  # a rollout is left to run
    assert not eval_only(RuntimeSpec(**{**base, "debug_rollout_only": False}))  # it would train
    assert not eval_only(RuntimeSpec(**{**base, "eval_prompt_data": None}))  # nothing to evaluate


def test_eval_only_job_scores_every_eval_set(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is the built-in one in a rollout actor of its own (`RELAX_ROLLOUT_ENGINE=in-process`): the
    mode is what is checked here; eval jobs on engine servers are tests/e2e/test_evals.py's (a server is one
    more process to start: the whole test 30.6 -> 22.5 s of CPU)."""
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")
    small = tmp_path / "test_small.jsonl"
    small.write_text("".join(artifacts["test"].read_text().splitlines(keepends=True)[:8]))
    spec = eval_spec(artifacts["warm"], small, tmp_path / "out")
    spec_file = tmp_path / "eval.json"
    spec_file.write_text(json.dumps({"name": "eval", "spec": spec}))
    report = tmp_path / "report"
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 0
    metrics = read_metrics(report)
    assert {"eval/arith", "eval/arith-pass@1", "eval/arith-pass@2", "eval/arith-pass@4"} <= set(metrics)
    assert not any(
        name.startswith(("train/", "rollout/")) for name in metrics
    )  # nothing trained or rolled out
    score = metrics["eval/arith"][1]
    print(
        f"eval-only, warm model, 8 prompts x 4: { ({k: round(v[1], 3) for k, v in sorted(metrics.items())}) }"
    )
    # real generation and real scoring: the SFT-warmed model answers some problems, not all
    assert 0.0 < score < 1.0 and metrics["eval/arith-pass@4"][1] >= metrics["eval/arith-pass@1"][1]
    records = (tmp_path / "out" / "rollout_result" / "eval" / "1.jsonl").read_text().splitlines()
    assert len(records) == 8 * 4  # every prompt, every sample, scored
    assert all("reward" in json.loads(line) for line in records)
    assert not (tmp_path / "out" / "never-read.jsonl").exists()
