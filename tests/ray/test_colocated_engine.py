"""Colocated GRPO with the rollout engine inside the trainer's actor (`EngineKind.IN_TRAINER`), through the
driver's loop on a real local Ray (CPU, the tiny model): after every step the engine holds exactly the
trainer's weights, pushed in place; a push that names the wrong version fails loudly; the turns release and
resume each side in order; and the run's numbers equal those of the same job with an engine actor of its
own fed through Ray's object store (`RELAX_ROLLOUT_ENGINE=in-process`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from runtime import driver
from runtime.pipeline import RLPipeline, build_pipeline
from runtime.reporter import LocalReporter
from tests.ray.conftest import read_metrics

pytestmark = pytest.mark.ray

STEPS = 5


def colocated_spec(artifacts: dict[str, Path], out: Path) -> dict:
    return {
        "train-backend": "torch",
        "hf-checkpoint": str(artifacts["warm"]),
        "ref-load": str(artifacts["warm"]),
        "prompt-data": str(artifacts["train_small"]),
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-shuffle": True,
        "rollout-batch-size": 16,
        "n-samples-per-prompt": 8,
        "rollout-max-response-len": 8,
        "global-batch-size": 128,
        "micro-batch-size": 128,
        "num-rollout": STEPS,
        "lr": 2e-3,
        "lr-decay-style": "constant",
        "lr-warmup-iters": 10,
        "weight-decay": 0.0,
        "eps-clip-high": 0.28,
        "use-kl-loss": True,  # the trainer holds the reference model too
        "kl-loss-coef": 0.05,
        "kl-loss-type": "low_var_kl",
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": str(out / "ckpt"),
    }


class WeightCheck:
    """A metric sink: at each step's report (after that step's weight push) it asks the trainer's actor
    how far its engine's weights are from the trainer's, and which version the engine holds."""

    def __init__(self, pipeline: RLPipeline) -> None:
        self.pipeline = pipeline
        self.mismatch: dict[int, float] = {}
        self.versions: dict[int, int] = {}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if "rollout/reward" not in values:
            return
        train = self.pipeline.roles.train
        assert train is not None
        self.mismatch[step] = train.engine_weight_mismatch()
        self.versions[step] = ray.get(train.actors[0].engine_weight_version.remote())

    def close(self) -> None:
        pass


def test_engine_in_the_trainer_matches_the_separate_engine(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAX_ROLLOUT_ENGINE", raising=False)
    raw = colocated_spec(artifacts, tmp_path / "in-trainer")
    spec = driver.load_job_spec(raw, name="in-trainer", normalized=False)
    driver.check_capabilities(spec)
    reporter = LocalReporter(tmp_path / "in-trainer" / "report")
    pipeline = build_pipeline(spec, reporter)
    try:
        assert isinstance(pipeline, RLPipeline) and pipeline.roles.engines_in_trainer
        assert pipeline.roles.rollout is not None and pipeline.roles.train is not None
        assert pipeline.roles.rollout.actors == pipeline.roles.train.actors  # one process per rank
        check = WeightCheck(pipeline)
        reporter.add_sink(check)  # type: ignore[arg-type]
        driver.run_rl(pipeline, pipeline.resume())

        assert check.mismatch == dict.fromkeys(range(STEPS), 0.0)  # exactly the trainer's, every step
        assert check.versions == {step: step + 1 for step in range(STEPS)}
        # the idle side released at every turn, never both at once: the first push leaves the trainer
        # offloaded; then each step trains (engine off, trainer on) and pushes (engine on, trainer off)
        (calls,) = pipeline.roles.train.memory_calls()
        step = ["engine.offload", "train.onload", "engine.onload", "train.offload"]
        assert calls == ["train.offload"] + step * STEPS
        # a push naming a version the engine does not hold fails loudly, and changes nothing
        with pytest.raises(
            ray.exceptions.RayTaskError, match="the engine holds 5, the driver expected it to hold 3"
        ):
            ray.get(pipeline.roles.train.async_push_in_place(6, 3))
        assert pipeline.roles.train.engine_weight_mismatch() == 0.0
    finally:
        pipeline.close()
        reporter.close(timeout=5, final="exit 0: finished")
    ours = read_metrics(tmp_path / "in-trainer" / "report")

    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")  # an engine actor of its own, object store
    spec_file = tmp_path / "separate.json"
    spec_file.write_text(
        json.dumps({"name": "separate", "spec": colocated_spec(artifacts, tmp_path / "separate")})
    )
    assert driver.main(["--spec-file", str(spec_file)]) == 0
    theirs = read_metrics(tmp_path / "separate" / "report")

    for name in (
        "rollout/reward",
        "rollout/response_len",
        "train/loss",
        "train/grad_norm",
        "rollout/weight_version",
    ):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-7), name
    assert max(ours["rollout/logprob_abs_diff"].values()) < 1e-3


def test_fastgen_in_the_trainer_takes_every_push_exactly(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine a CUDA rank hosts by default (fastgen: flat weight buffer, offloaded to host and back
    each turn), here on CPU: the same hand-over, version by version, exact."""
    monkeypatch.delenv("RELAX_ROLLOUT_ENGINE", raising=False)
    monkeypatch.setenv("RELAX_ROLLOUT_BACKEND", "fastgen")
    raw = {**colocated_spec(artifacts, tmp_path), "num-rollout": 3, "update-weights-interval": 2}
    spec = driver.load_job_spec(raw, name="fastgen", normalized=False)
    reporter = LocalReporter(tmp_path / "report")
    pipeline = build_pipeline(spec, reporter)
    try:
        assert isinstance(pipeline, RLPipeline) and pipeline.roles.train is not None
        assert ray.get(pipeline.roles.train.actors[0].ready.remote())["engine"] == "FastGenEngine"
        check = WeightCheck(pipeline)
        reporter.add_sink(check)  # type: ignore[arg-type]
        driver.run_rl(pipeline, pipeline.resume())
        # pushed after step 1 only (every 2 rollouts; the version skips to 2): exact then, stale otherwise
        assert check.versions == {0: 0, 1: 2, 2: 2}
        assert check.mismatch[1] == 0.0 and check.mismatch[0] > 0.0
        (calls,) = pipeline.roles.train.memory_calls()
        assert calls[:1] == ["train.offload"] and calls.count("engine.offload") == 3
    finally:
        pipeline.close()
        reporter.close(timeout=5, final="exit 0: finished")
    metrics = read_metrics(tmp_path / "report")
    assert metrics["rollout/weight_version"] == {0: 0, 1: 0, 2: 2}
