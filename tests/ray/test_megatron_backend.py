"""The megatron backend through the driver on a real local Ray, on CPU: two trainer ranks (TP=2 over gloo),
colocated with two rollout engines; GRPO steps, weight sync, checkpoints in torch_dist, exact resume; SFT with
an eval; PPO with a critic of two ranks (and, for comparison, the torch backend's PPO)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime import driver
from tests.ray.conftest import read_metrics, read_reports

pytestmark = pytest.mark.ray


def megatron_spec(artifacts: dict[str, Path], out: Path, **overrides) -> dict:
    spec = {
        "train-backend": "megatron",
        "tensor-model-parallel-size": 2,
        "hf-checkpoint": str(artifacts["warm"]),
        "ref-load": str(artifacts["warm"]),
        "prompt-data": str(artifacts["train_small"]),
        "input-key": "input",
        "label-key": "label",
        "rm-type": "math",
        "rollout-shuffle": True,
        "rollout-batch-size": 8,
        "n-samples-per-prompt": 4,
        "rollout-max-response-len": 8,
        "global-batch-size": 16,
        "micro-batch-size": 8,
        "num-rollout": 4,
        "lr": 2e-3,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
        "hidden-dropout": 0.0,
        "attention-dropout": 0.0,
        "eps-clip-high": 0.28,
        "use-kl-loss": True,
        "kl-loss-coef": 0.05,
        "kl-loss-type": "low_var_kl",
        "colocate": True,
        "resource": {"actor": [1, 2], "rollout": [1, 2]},
        "save": str(out / "ckpt"),
        "save-interval": 2,
        "save-hf": str(out / "hf"),
    }
    spec.update(overrides)
    return spec


def _run(tmp_path: Path, name: str, spec: dict) -> Path:
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps({"name": name, "spec": spec}))
    report = tmp_path / f"report-{name}"
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(report)]) == 0
    return report


def test_resume_from_a_torch_dist_checkpoint_is_exact(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 rollouts in one run (async saves at iterations 1 and 3) equal a new driver that loads iteration 1 of
    that run and runs rollouts 2 and 3: same data, same optimizer state and RNG, so the same losses and the
    same final weights. (The second driver starts from a copy of iteration 1 alone, `latest` pointing at it,
    as a run stopped after 2 rollouts leaves it: a third driver that ran those 2 rollouts cost ~25 s of the
    suite and checked nothing the copy does not.) The engines live in the trainer's rank actors
    (`RELAX_ROLLOUT_ENGINE=in-trainer`): what is checked is the trainer's checkpoint (the second driver's
    engines must sample rollouts 2 and 3 with the weights it loaded, or the rewards differ), and each driver
    starts two processes instead of four with engine actors of their own (call 34.4/38.0 s -> 26.6/21.7 s).

    The first driver is also the suite's GRPO run of the megatron backend through the driver on a real Ray (it
    was a test of its own, the same spec with the KL term on and synchronous saves: 75 s of the loaded CI for
    what this run produces anyway): every step's metrics, the engines sampling with the trainer's weights, the
    torch_dist checkpoint's files and state, the Hugging Face export and the checkpoints reported. The KL term
    and 100 steps are tests/e2e/test_megatron_learns.py's, which runs the same layout (TP=2, colocated,
    engines in the trainer) through the platform; its checkpoints there are saved synchronously."""
    from safetensors.torch import load_file

    from runtime.train.checkpoint import write_latest_iteration

    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-trainer")

    base = {"num-rollout": 4, "use-kl-loss": False, "kl-loss-coef": 0.0}
    whole, split = tmp_path / "whole", tmp_path / "split"
    report_a = _run(tmp_path, "whole", megatron_spec(artifacts, whole, **base, **{"async-save": True}))
    (split / "ckpt").mkdir(parents=True)
    shutil.copytree(whole / "ckpt" / "iter_0000001", split / "ckpt" / "iter_0000001")
    write_latest_iteration(split / "ckpt", 1)
    report_b = _run(
        tmp_path, "second-half", megatron_spec(artifacts, split, **base, load=str(split / "ckpt"))
    )

    one, two = read_metrics(report_a), read_metrics(report_b)
    steps = range(4)
    for name in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/lr"):
        assert set(one[name]) >= set(steps), name
    # without the KL term a gradient flows exactly where some group's rewards differ (a step with none: 0)
    for s in steps:
        assert (one["train/grad_norm"][s] > 0) == (one["rollout/zero_std_ratio"][s] < 1), s
    assert min(one["rollout/zero_std_ratio"].values()) < 1
    assert one["train/lr"][3] == pytest.approx(2e-3)
    # the engines sample with the trainer's weights (bf16 on the trainer side, fp32 in the engine)
    assert max(one["rollout/logprob_abs_diff"].values()) < 0.05
    assert one["rollout/weight_version"][3] == 3
    ckpt = whole / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    folder = ckpt / "iter_0000003"
    assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp"))
    state = json.loads((folder / "trainer_state.json").read_text())
    # two optimizer steps per rollout (32 samples, global batch 16)
    assert state["layout"] == "relax-megatron/1" and state["optimizer_steps"] == 8 and state["has_optimizer"]
    assert (whole / "hf" / "tokenizer.json").is_file()

    assert sorted(two["train/loss"]) == [2, 3]  # the second driver resumed at rollout 2
    for step in (2, 3):
        assert two["rollout/reward"][step] == one["rollout/reward"][step]
        assert two["train/loss"][step] == pytest.approx(one["train/loss"][step], abs=1e-6)
        assert two["train/grad_norm"][step] == pytest.approx(one["train/grad_norm"][step], rel=1e-5)
    weights_a = load_file(whole / "hf" / "model.safetensors")
    weights_b = load_file(split / "hf" / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    worst = max(float((weights_a[k].float() - weights_b[k].float()).abs().max()) for k in weights_a)
    assert worst == 0.0, worst
    start = load_file(artifacts["warm"] / "model.safetensors")
    assert max(float((weights_a[k].float() - start[k]).abs().max()) for k in start) > 1e-4  # it trained
    # the async saves were completed and registered, and the Hugging Face export
    checkpoints = [(c["step"], c["format"]) for r in read_reports(report_a) for c in r["checkpoints"]]
    assert sorted(step for step, fmt in checkpoints if fmt == "torch") == [1, 3]
    assert (3, "hf") in checkpoints


def test_sft_with_perplexity_eval(ray_local, artifacts: dict[str, Path], tmp_path: Path) -> None:
    """SFT on the megatron backend (TP=2, no rollout engines): the loss falls and the held-out
    perplexity (evaluate_nll on every rank, answered by rank 0) is reported."""
    spec = {
        "train-backend": "megatron",
        "tensor-model-parallel-size": 2,
        "hf-checkpoint": str(artifacts["model"]),
        "prompt-data": str(artifacts["sft"]),
        "input-key": "input",
        "label-key": "output",
        "loss-type": "sft",
        "rollout-shuffle": True,
        "rollout-batch-size": 32,
        "global-batch-size": 32,
        "use-dynamic-batch-size": True,
        "max-tokens-per-gpu": 1024,
        "num-rollout": 20,
        "lr": 3e-3,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
        "hidden-dropout": 0.0,
        "attention-dropout": 0.0,
        "eval-size": 0.05,
        "eval-interval": 10,
        "resource": {"actor": [1, 2], "rollout": [1, 1]},
    }
    metrics = read_metrics(_run(tmp_path, "megatron-sft", spec))
    loss = metrics["train/loss"]
    assert sum(loss[s] for s in range(3)) / 3 > sum(loss[s] for s in range(17, 20)) / 3 + 0.5
    ppl = metrics["eval/ppl"]
    assert ppl[max(ppl)] < ppl[min(ppl)]


# megatron-core's arguments, which the torch backend refuses by name
MEGATRON_ONLY = ("tensor-model-parallel-size", "hidden-dropout", "attention-dropout")


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_ppo_as_relax_scripts_run_it(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """PPO without --use-rollout-logprobs (as Relax's PPO scripts run it) through the driver. The critic trains
    alone for `num-critic-only-steps`, then beside the policy, reports its value loss and saves its checkpoint
    beside the policy's. torch: one critic process on a device of its own; megatron: a critic entry of two
    devices, so two megatron-core ranks of the critic's own process group (data parallel: the spec's TP is 1;
    TP=2 + SP, as Relax's script runs it, is matched against the one-rank critic in
    tests/unit/runtime/test_megatron_critic.py, and costs 24 s more here).

    The ratio's pi_old is the trainer's recompute, not the engine's: with the engines updated every 3 steps,
    rollout 2 is sampled by the initial weights while the policy trained at step 1, so the engine's log-probs
    are a step behind (`rollout/logprob_abs_diff`, and the loss's own |old - rollout|), and still the policy's
    first update of step 2 starts at ratio 1 (`ppo_kl` 0, nothing clipped).

    The engines run inside actors of their own (`RELAX_ROLLOUT_ENGINE=in-process`; the layout's one engine per
    colocated device, 2 here with torch, 3 with megatron, would otherwise each start an HTTP server process:
    5-8 s more per run on two cores); the engine servers are driven by tests/ray/test_driver_grpo.py."""
    spec = megatron_spec(
        artifacts,
        tmp_path,
        **{
            "advantage-estimator": "ppo",
            "use-kl-loss": False,
            "kl-loss-coef": 0.0,
            "rollout-batch-size": 4,
            "global-batch-size": 16,
            "num-rollout": 3,
            "num-critic-only-steps": 1,
            "update-weights-interval": 3,
            "value-clip": 0.2,
            "critic-lr": 3e-3,
            "save-interval": 2,
        },
    )
    del spec["save-hf"]
    if backend == "megatron":
        spec.update(
            {
                "tensor-model-parallel-size": 1,
                "resource": {"actor": [1, 1], "critic": [1, 2], "rollout": [1, 1], "advantages": [1, 0]},
            }
        )
    else:
        spec = {k: v for k, v in spec.items() if k not in MEGATRON_ONLY}
        spec.update(
            {
                "train-backend": "torch",
                "resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 1], "advantages": [1, 0]},
            }
        )
    assert "use-rollout-logprobs" not in spec
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")
    report = _run(tmp_path, f"{backend}-ppo", spec)

    metrics = read_metrics(report)
    steps = range(3)
    for name in ("train/value_loss", "train/value_clipfrac", "train/critic_grad_norm", "train/critic_lr"):
        assert set(metrics[name]) >= set(steps), name
    assert all(metrics["train/critic_grad_norm"][s] > 0 for s in steps)
    assert metrics["train/value_loss"][0] > 0  # a fresh critic predicts 0: the first loss is the returns'
    assert set(metrics["train/pg_loss"]) == {1, 2}  # the policy waited one critic-only step
    # step 2: the engine's log-probs are a step behind the trainer's, and the loss took the trainer's
    stale = metrics["rollout/logprob_abs_diff"][2]
    assert stale > 10 * metrics["rollout/logprob_abs_diff"][1], metrics["rollout/logprob_abs_diff"]
    assert metrics["train/train_rollout_logprob_abs_diff"][2] > 0.5 * stale
    assert abs(metrics["train/ppo_kl"][2]) < 0.05 * stale and metrics["train/pg_clipfrac"][2] == 0
    logs = [item for r in read_reports(report) for item in r.get("logs", [])]
    sources = {i["source"] for i in logs if f"{backend} critic ready" in i["message"]}
    assert sources == ({"actor:critic0", "actor:critic1"} if backend == "megatron" else {"actor:critic"})
    # megatron-core ranks import it without W&B and TensorBoard and, on CPU, without compiling its fusions
    # (runtime/train/megatron/startup.py); the driver's process (this one, a Ray driver) is never changed
    imported = {
        i["source"]: i["message"] for i in logs if "megatron-core imported for a rank" in i["message"]
    }
    if backend == "megatron":
        from runtime.train.megatron.startup import in_ray_worker

        assert set(imported) == {"actor:train", "actor:critic0", "actor:critic1"}, imported
        lean = "absent wandb,torch.utils.tensorboard; jit_fuser eager; compile_fx not imported"
        assert all(message.endswith(lean) for message in imported.values()), imported
        assert not in_ray_worker()
    else:
        assert imported == {}
    critic = tmp_path / "ckpt" / "critic"
    latest = int((critic / "latest_checkpointed_iteration.txt").read_text())
    folder = critic / f"iter_{latest:07d}"
    state = json.loads((folder / "critic_state.json").read_text())
    # one optimizer step per rollout (16 samples, global batch 16)
    assert latest == 2 and state["optimizer_steps"] == latest + 1
    if backend == "megatron":
        assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp"))
        assert state["layout"] == "relax-megatron-critic/1"
        assert state["parallel"]["tp"] == 1 and state["parallel"]["dp"] == 2  # the two ranks share the data
