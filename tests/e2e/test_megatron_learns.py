"""The Megatron backend end to end on the embedded platform: examples/grpo-arith-megatron.yaml (the arithmetic
task of grpo-arith.yaml, `--train-backend megatron`, tensor parallelism 2 on two CPU slots over gloo),
submitted over HTTP after the SFT warm-up it starts from, learns as the torch run does. The example's 300 steps
take rollout/reward from ~0.13 to ~0.7 (docs/reference/runtime.md; `python -m bench.example_run --grpo
grpo-arith-megatron`); here the same spec runs 60 steps, its warmup 10 of them (the cosine schedule then
decays over 60), which takes it from below 0.2 (mean of the first 5 steps) to more than 0.08 above that and
above 0.22 (mean of the last 10): measured 0.130 -> 0.285, and 0.136 -> 0.288 with --seed 1 (`python -m
runtime.demo ROOT --examples sft-arith.yaml grpo-arith-megatron.yaml --set num-rollout=60 --set
lr-warmup-iters=10`); 0.119 -> 0.261 and 0.131 -> 0.274 with the torch backend (grpo-arith.yaml). (100 steps
and the example's warmup of 20: 0.134 -> 0.362, ~40% more of the test's time.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.harness import ROOT, RunningPlatform
from client.sdk import RelaxClient
from tests.e2e.conftest import log_problems

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


STEPS, WARMUP, SAVE_INTERVAL = 60, 10, 30


@pytest.fixture(scope="module")
def platform(three_slot_platform: RunningPlatform) -> RunningPlatform:
    """tests/e2e/conftest.py's platform of three slots (a pass every second), shared with the modules next to this
    one in the first lane (test_elastic_rollout before, test_network_exposure and test_reliability after): a
    platform fewer to start and stop there, which started the shared platform of two slots for this module and
    test_network_exposure alone. The job takes two of its slots; `sft_arith` runs on it too. Both jobs end
    before the module does (`--wait`)."""
    return three_slot_platform


@pytest.mark.timeout(1200)  # ~70 s alone
def test_grpo_megatron_tp2_learns(platform: RunningPlatform, sft_arith: dict, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "grpo-arith-megatron.yaml").read_text())
    assert doc["spec"]["train-backend"] == "megatron" and doc["spec"]["tensor-model-parallel-size"] == 2
    doc["spec"] |= {"num-rollout": STEPS, "lr-warmup-iters": WARMUP, "save-interval": SAVE_INTERVAL}
    job_file = tmp_path / "grpo-arith-megatron.yaml"
    job_file.write_text(yaml.safe_dump(doc))

    # over HTTP: the CLI posts the example's spec (60 steps) to the API and waits for the job
    r = platform.relaxctl("submit", str(job_file), "--wait", timeout=1100)
    assert r.returncode == 0, r.stdout + r.stderr + platform.log()
    c = RelaxClient(platform.url, platform.key)
    job = c.get_job(c.list_jobs(name="grpo-arith-megatron")["data"][0]["id"])
    assert job["status"] == "SUCCEEDED", job

    # It started from the SFT export and trained with the megatron backend, TP=2 on two slots.
    assert job["spec"]["hf_checkpoint"].startswith(sft_arith["output_dir"])
    assert job["submitted"]["inputs"][0]["job_id"] == sft_arith["id"]
    assert job["spec"]["train_backend"] == "megatron" and job["spec"]["tensor_model_parallel_size"] == 2

    # It learned: the mean reward of the first steps below 0.2, of the last steps more than 0.08 above it and
    # above 0.22. (A step's reward scatters by ~0.035 about the run's trend, so the difference of the two means
    # by ~0.02 for a run that does not learn: 0.08 is 4 of those; the runs measured are 0.14-0.155 above.)
    names = ["rollout/reward", "rollout/logprob_abs_diff", "rollout/weight_version"]
    names += [f"train/{n}" for n in ("loss", "pg_loss", "kl_loss", "entropy", "grad_norm", "lr")]
    series = {
        name: {p["step"]: p["value"] for p in points}
        for name, points in c.metrics(job["id"], names=names).items()
    }
    reward = [series["rollout/reward"][s] for s in sorted(series["rollout/reward"])]
    assert len(reward) == STEPS, len(reward)
    first, last = sum(reward[:5]) / 5, sum(reward[-10:]) / 10
    print(f"grpo-arith-megatron: rollout/reward {first:.3f} (first 5 steps) -> {last:.3f} (last 10 steps)")
    assert first < 0.2 and last > 0.22 and last - first > 0.08, reward

    # Every step's training metrics (with the KL term against the SFT reference), a gradient at every step,
    # and the learning rate's warmup (10 steps) and cosine decay to min-lr (tests/ray/test_megatron_backend.py
    # ran these 4 steps of a megatron GRPO run of their own, with a constant rate)
    for name in names[3:]:
        assert set(series[name]) == set(range(STEPS)), name
    assert all(v > 0 for v in series["train/grad_norm"].values())
    assert any(v != 0 for v in series["train/kl_loss"].values())
    lr = series["train/lr"]
    assert lr[0] < lr[5] < lr[9] == pytest.approx(2e-3) and 2e-4 <= lr[59] < lr[35] < lr[9]
    # the engines sample with the trainer's weights after every step (bf16 trainer, fp32 engine)
    diff = series["rollout/logprob_abs_diff"]
    print(f"grpo-arith-megatron: rollout/logprob_abs_diff max {max(diff.values()):.4f}")
    assert max(diff.values()) < 0.05
    assert all(series["rollout/weight_version"][s] == s for s in range(STEPS))

    # No error or traceback in the log of a job that succeeded (the SFT warm-up's and this one's).
    assert log_problems(c, job["id"]) == [] and log_problems(c, sft_arith["id"]) == []

    # Checkpoints registered, and the Hugging Face export written.
    ckpts = c.checkpoints(job["id"])
    assert ckpts and all(ck["size_bytes"] > 0 for ck in ckpts)
    # saved synchronously at steps 29 and 59 (save-interval 30) in megatron's torch_dist format, beside the
    # export; one optimizer step per rollout (32 prompts x 8 samples, global batch 256)
    assert {(ck["step"], ck["format"]) for ck in ckpts} == {
        (29, "torch"),
        (29, "hf"),
        (59, "torch"),
        (59, "hf"),
    }
    folder = Path(next(ck["path"] for ck in ckpts if ck["step"] == 59 and ck["format"] == "torch"))
    assert (folder.parent / "latest_checkpointed_iteration.txt").read_text().strip() == "59"
    assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp"))
    state = json.loads((folder / "trainer_state.json").read_text())
    assert (
        state["layout"] == "relax-megatron/1" and state["optimizer_steps"] == STEPS and state["has_optimizer"]
    )
    hf = Path(next(ck["path"] for ck in ckpts if ck["format"] == "hf"))
    assert (hf / "model.safetensors").is_file() and (hf / "tokenizer.json").is_file()


@pytest.mark.timeout(300)  # ~25 s alone
def test_gpu_platform_bench_tiny(platform: RunningPlatform) -> None:
    """`python -m bench.gpu_platform --tiny`'s platform row on this module's platform: bench.gpu_grpo's workload
    (tiny shape) as a job spec (a random model folder, digit prompts, the even-id reward hook, the on-policy
    loss hook, megatron backend colocated) submitted over HTTP succeeds, and every step's step time comes back
    through the job's event stream, equal to what the metrics route stores."""
    from bench.gpu_grpo import parse, workload
    from bench.gpu_platform import run_job, summarize_platform

    work = workload(parse(["--tiny", "--rows", "ours"]))
    res = run_job(platform, work, steps=2, cuda=False, timeout=240, log=print)
    assert res["status"] == "SUCCEEDED", res.get("log_tail")
    assert res["pool"]["name"] == "local" and res["pool"]["total_gpus"] >= 1
    assert res["stream_error"] is None
    steps = res["streamed"]["perf/step_time"]
    assert len(steps) == 2 and steps == res["stored"]["perf/step_time"]
    row = summarize_platform(work, res, warmup=1)
    assert row["steps"] == 2 and row["step_s"] > 0 and row["gen_tokens_per_s"] > 0
    assert set(row["parts_s"]) >= {"rollout", "log_probs", "train", "weight_sync"}
