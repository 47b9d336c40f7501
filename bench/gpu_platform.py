"""`bench.gpu_grpo --rows ours` as a job through the platform (issue 12 item 5), one table beside the bench itself.

    python -m bench.gpu_platform            # GPU host: the platform (as `make run` starts it), the job, the bench row
    python -m bench.gpu_platform --tiny     # anywhere (CPU): the tiny shape, the same path end to end

Starts the embedded platform in a temp home (`bench.harness.start_platform`: `python -m api.embedded`, what
`make run` -> `relaxctl up` runs), checks that pool `local` shows this machine's GPU (on CPU: its CPU slots),
writes the workload's inputs into the team's area and submits, over HTTP with the SDK (`client.sdk`), the job
spec `job_spec` builds: bench.gpu_grpo's workload, expressed with existing spec fields:

- the model: `artifacts://models/gpu-grpo`, a Qwen2 folder of the shape (`bench.gpu_train.SHAPES`), randomly
  initialised (Hugging Face's init, seeded; the bench uses megatron's, which the spec cannot ask for) and saved as
  safetensors, with no EOS id on CUDA (so every sample has exactly `--new-tokens`; fastgen stops on the
  checkpoint's EOS ids only), and a byte-level tokenizer with no merges (`digit_tokenizer`: transformers
  loads a `qwen2` folder's tokenizer with Qwen2's pre-tokenizer split, whatever tokenizer.json says, and that
  split spells numbers one digit per token);
- the prompts: `artifacts://datasets/gpu-grpo/prompts.jsonl`, the bench's random ids (`Workload.prompt_ids`)
  each written as its last digit, so each prompt is exactly `--prompt-len` tokens (ids of the 10 digits,
  where the bench's range over the whole vocabulary: the same lengths and work, other ids);
- the reward: `custom-rm-path: bench.gpu_platform.even_share` (the bench's share of even ids in the response);
- the loss: `loss-type: custom_loss` with `custom-loss-function-path: bench.gpu_grpo.on_policy_loss` (pi_old =
  the training pass's own log-probs, detached: the bench's and TRL's choice), GRPO advantages, no KL, one
  optimizer step per rollout (`global-batch-size` = prompts x samples), the bench's lr, Adam betas, clip and seed;
- megatron backend with padded rows (`qkv-format: bshd`), micro-batches of `--micro-batch` rows; the built-in
  engine (fastgen on CUDA) colocated on the one GPU, hosted in the trainer's actor (no `--sglang-*` argument:
  one would keep it in a server actor of its own).

Both sides stay resident (`offload-train: false`, `offload-rollout: false`), as in the bench, and with
`true-on-policy-mode: true` the driver does not recompute the old log-probs in a forward pass of the trainer (the
loss takes the training pass's, detached, as the bench does): `perf/log_probs_time` is only the stage's building
of the batch. What the platform still does that the bench does not: it moves the rollout's samples through its
stages (the batch built from the samples, rewards per sample, metrics) and reports each step to the platform.

It reads the step times back while the job runs from the job's event stream (`RelaxClient.stream`, the metric
rows as they arrive: `perf/step_time`, `perf/rollout_time`, ...) and prints them beside `python -m
bench.gpu_grpo --rows ours` (same workload, run first in its own process on the same machine): steady step time
(mean of the steps after `--warmup`), generation new tok/s (new tokens / `perf/rollout_time`, the rollout stage
including the reward), and the ratio. `--json FILE` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wire.jobs import TERMINAL, JobStatus

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "gpu-grpo"
STAGES = ("rollout", "reward", "log_probs", "advantages", "train", "weight_sync")


def even_share(args: Any, sample: Any) -> float:
    """`custom-rm-path` reward: the share of even ids in the response (`bench.gpu_grpo.response_rewards`)."""
    response = sample.response_tokens
    return sum(1 for t in response if t % 2 == 0) / max(1, len(response))


# ------------------------------------------------------------------------------------------------- inputs


def digit_tokenizer(vocab: int) -> Any:
    """A tokenizer of `vocab` ids that survives transformers' Qwen2 loading: byte-level BPE without merges
    (`<pad>` 0, `<eos>` 1, the 256 byte symbols, then `<|xN|>` fillers up to `vocab`), Qwen2's split
    (`runtime.models.tiny.QWEN2_SPLIT_PATTERN`): a string of k digits is k tokens; every id decodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from runtime.models.tiny import QWEN2_SPLIT_PATTERN

    ids = {"<pad>": 0, "<eos>": 1}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        ids[symbol] = len(ids)
    if vocab < len(ids):
        raise ValueError(f"a vocabulary of {vocab} ids is smaller than the byte alphabet ({len(ids)})")
    while len(ids) < vocab:
        ids[f"<|x{len(ids)}|>"] = len(ids)
    core = Tokenizer(models.BPE(vocab=ids, merges=[]))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")


def write_inputs(area: Path, work: Any, *, cuda: bool) -> dict[str, str]:
    """The model folder and the prompt file in the team's area; their artifacts:// names."""
    import torch

    from bench.gpu_grpo import hf_model

    model_dir = area / "models" / MODEL_NAME
    data_dir = area / "datasets" / MODEL_NAME
    data_dir.mkdir(parents=True, exist_ok=True)
    model = hf_model(work, torch.device("cuda" if cuda else "cpu"))
    # fastgen (CUDA) stops on the checkpoint's EOS ids only: none, so every sample is exactly new_tokens long.
    # The CPU engine (Hugging Face generate) needs one: <eos> (1), which a tiny random model rarely samples.
    model.config.eos_token_id = None if cuda else 1
    model.generation_config.eos_token_id = None if cuda else 1
    model.save_pretrained(model_dir, safe_serialization=True)
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    digit_tokenizer(work.shape.vocab).save_pretrained(model_dir)
    del model
    with open(data_dir / "prompts.jsonl", "w") as f:
        for row in work.prompt_ids().tolist():
            f.write(json.dumps({"prompt": "".join(str(i % 10) for i in row)}) + "\n")
    return {
        "model": f"artifacts://models/{MODEL_NAME}",
        "prompts": f"artifacts://datasets/{MODEL_NAME}/prompts.jsonl",
    }


def job_spec(work: Any, inputs: dict[str, str], *, steps: int) -> dict[str, Any]:
    """bench.gpu_grpo's `ours` workload as a job spec (see the module docstring)."""
    return {
        "train-backend": "megatron",
        "hf-checkpoint": inputs["model"],
        "prompt-data": inputs["prompts"],
        "input-key": "prompt",
        "custom-rm-path": "bench.gpu_platform.even_share",
        "rollout-batch-size": work.prompts,
        "n-samples-per-prompt": work.samples,
        "rollout-max-prompt-len": work.prompt_len,
        "rollout-max-response-len": work.new_tokens,
        "rollout-temperature": 1.0,
        "rollout-seed": work.seed,
        "global-batch-size": work.rows,  # one optimizer step per rollout
        # pi_old = the train forward's own log-probs (detached), as the bench and TRL take it: the driver does
        # not ask the trainer for a recompute (runtime.pipeline.plans.old_log_probs_from_train_forward)
        "true-on-policy-mode": True,
        "micro-batch-size": work.micro_batch,
        "qkv-format": "bshd",
        "seq-length": work.seq,  # as the bench's backend (bench.gpu_train.backend_values)
        "log-probs-chunk-size": min(4096, work.micro_batch * work.seq),
        "num-rollout": steps,
        "advantage-estimator": "grpo",
        "use-kl-loss": False,
        "loss-type": "custom_loss",
        "custom-loss-function-path": "bench.gpu_grpo.on_policy_loss",
        "lr": work.lr,
        "lr-decay-style": "constant",
        "weight-decay": 0.0,
        "adam-beta1": 0.9,
        "adam-beta2": 0.999,
        "clip-grad": 1.0,
        "seed": work.seed,
        "hidden-dropout": 0.0,
        "attention-dropout": 0.0,
        "colocate": True,
        # both sides stay on the GPU, as in the bench (colocated jobs release the idle side's memory by default)
        "offload-train": False,
        "offload-rollout": False,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        # No `--sglang-*` argument: any keeps the engine in HTTP servers of its own actor; without, a colocated RL
        # job hosts the engine in the trainer's actor, weights handed over in place (runtime/roles/colocated.py).
        # The spec measured on 2026-12-06 had `sglang: {max_running_requests: rows}` (servers; docs/benchmarks.md).
    }


# -------------------------------------------------------------------------------------------- the platform


class MetricStream:
    """The job's event stream (`RelaxClient.stream`) read in a thread: the metric rows as they arrive."""

    def __init__(self, client: Any, job_id: str) -> None:
        self.client, self.job_id = client, job_id
        self.points: dict[str, dict[int, float]] = {}
        self.statuses: list[str] = []
        self.error: str | None = None
        self.arrivals: list[tuple[float, str, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for kind, data in self.client.stream(self.job_id):
                if kind == "metric":
                    self.points.setdefault(data["name"], {})[int(data["step"])] = float(data["value"])
                    self.arrivals.append((time.time(), data["name"], int(data["step"])))
                elif kind == "status":
                    self.statuses.append(str(data.get("status") or data.get("to_status")))
        except Exception as exc:  # noqa: BLE001 - reported with the table
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self) -> MetricStream:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def series(self, name: str) -> list[float]:
        return [v for _, v in sorted(self.points.get(name, {}).items())]


def local_pool(client: Any) -> dict[str, Any]:
    pools = {p["name"]: p for p in client.pools()}
    if "local" not in pools:
        raise RuntimeError(f"no pool `local` (pools: {sorted(pools)})")
    return pools["local"]


def run_platform(
    work: Any, *, steps: int, cuda: bool, timeout: float, log: Any, home: Path
) -> dict[str, Any]:
    """The platform up (as `make run` starts it), the job run on it (`run_job`), the platform stopped."""
    from bench.harness import start_platform, stop_platform

    t0 = time.time()
    platform = start_platform(home)
    started = time.time() - t0
    try:
        out = run_job(platform, work, steps=steps, cuda=cuda, timeout=timeout, log=log)
    finally:
        if os.environ.get("GPU_PLATFORM_LOG"):
            Path(os.environ["GPU_PLATFORM_LOG"]).write_text(platform.log())
        stopped = stop_platform(platform)
    return {"platform_start_s": started, **out, "platform_stop_s": stopped}


def run_job(platform: Any, work: Any, *, steps: int, cuda: bool, timeout: float, log: Any) -> dict[str, Any]:
    """On a running platform (`bench.harness.RunningPlatform`): pool `local` checked, the inputs written, the
    job submitted over HTTP and followed to its end through its event stream; what came back."""
    from client.sdk import RelaxClient

    out: dict[str, Any] = {}
    client = RelaxClient(platform.url, platform.key, timeout=120)
    pool = local_pool(client)
    out["pool"] = {k: pool.get(k) for k in ("name", "accelerator", "total_gpus")}
    log(f"  pool local: {out['pool']}")
    if cuda and (pool["accelerator"] == "cpu" or pool["total_gpus"] != 1):
        raise RuntimeError(f"pool `local` does not show the one GPU: {out['pool']}")
    t1 = time.time()
    inputs = write_inputs(Path(client.storage()["area"]), work, cuda=cuda)
    out["inputs_s"] = time.time() - t1
    spec = job_spec(work, inputs, steps=steps)
    check = client.validate_spec(spec=spec)
    if not check.get("valid"):
        errors = [
            i
            for v in check.values()
            if isinstance(v, list)
            for i in v
            if isinstance(i, dict) and i.get("severity") != "warning"
        ]
        raise RuntimeError(f"the spec was refused: {json.dumps(errors)[:3000]}")
    out["derived"] = check.get("derived")
    job = client.submit_job(spec=spec, name="gpu-grpo-platform")
    out["job_id"] = job["id"]
    t_submit = time.time()
    stream = MetricStream(client, job["id"]).start()
    log(f"  submitted {job['id']}; following its stream")
    while time.time() - t_submit < timeout:
        job = client.get_job(job["id"])
        if job["status"] in TERMINAL:
            break
        time.sleep(2)
    out["status"] = job["status"]
    out["job_wall_s"] = time.time() - t_submit
    stream.join(30)
    if job["status"] not in TERMINAL:
        client.cancel_job(job["id"])
    out["stream_error"] = stream.error
    out["streamed"] = {name: stream.series(name) for name in sorted(stream.points)}
    # the same series read back from the metrics route, to check the stream missed none
    names = ["perf/step_time", *(f"perf/{s}_time" for s in STAGES)]
    stored = client.metrics(job["id"], names=names)
    out["stored"] = {n: [p["value"] for p in stored.get(n, [])] for n in names}
    if job["status"] != JobStatus.SUCCEEDED:
        logs = client.logs(job["id"], limit=1000)["data"]
        out["log_tail"] = [
            f"{line['source']} {line['level']}: {line['message'][:400]}" for line in logs[-40:]
        ]
    return out


def summarize_platform(work: Any, res: dict[str, Any], warmup: int) -> dict[str, Any]:
    from bench.gpu_grpo import _steady

    streamed = res.get("streamed", {})
    step = streamed.get("perf/step_time", [])
    rollout = streamed.get("perf/rollout_time", [])
    row: dict[str, Any] = {"row": "platform", "steps": len(step)}
    if step:
        row["step_s"] = _steady(step, warmup)
        row["first_step_s"] = step[0]
        row["parts_s"] = {
            s: _steady(streamed[f"perf/{s}_time"], warmup) for s in STAGES if streamed.get(f"perf/{s}_time")
        }
    if rollout:
        row["generate_s"] = _steady(rollout, warmup)
        row["gen_tokens_per_s"] = work.rows * work.new_tokens / row["generate_s"]
    return row


# ---------------------------------------------------------------------------------------------- the bench


def run_bench_row(argv: Sequence[str], log: Any) -> dict[str, Any]:
    """`python -m bench.gpu_grpo --rows ours` with the same workload, in its own process."""
    with tempfile.TemporaryDirectory(prefix="gpu-platform-bench-") as folder:
        path = os.path.join(folder, "ours.json")
        cmd = [sys.executable, "-m", "bench.gpu_grpo", *argv, "--rows", "ours", "--json", path]
        log("  " + " ".join(cmd[1:]))
        done = subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.PIPE, text=True)
        log(done.stdout.rstrip())
        if done.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"bench.gpu_grpo exited with {done.returncode}")
        with open(path) as f:
            return json.load(f)[0]


def table(bench: dict[str, Any] | None, platform: dict[str, Any]) -> str:
    def cells(r: dict[str, Any] | None) -> list[str]:
        if not r or "step_s" not in r:
            return ["", "", "", "", ""]
        parts = r.get("parts_s", {})
        shown = ", ".join(f"{k} {v:.3f}" for k, v in parts.items() if k != "step")
        return [
            f"{r['step_s']:.3f}",
            f"{r['first_step_s']:.1f}" if r.get("first_step_s") is not None else "",
            f"{r['gen_tokens_per_s'] / 1e3:,.1f}k" if "gen_tokens_per_s" in r else "",
            f"{r['generate_s']:.3f}" if "generate_s" in r else "",
            shown,
        ]

    head = "| run | step s (steady) | first step s | gen new tok/s | generate s | parts s (steady) |"
    lines = [head, "|---|---|---|---|---|---|"]
    if bench is not None:
        lines.append("| `bench.gpu_grpo --rows ours` (in process) | " + " | ".join(cells(bench)) + " |")
    lines.append("| the same workload as a job through the platform | " + " | ".join(cells(platform)) + " |")
    if bench and "step_s" in bench and "step_s" in platform:
        lines.append(
            f"| platform / bench | {platform['step_s'] / bench['step_s']:.2f}x | | "
            f"{platform['gen_tokens_per_s'] / bench['gen_tokens_per_s']:.2f}x | | |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_platform", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="bench.gpu_grpo's tiny workload (runs on CPU)")
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the steady means")
    p.add_argument("--steps", type=int, default=3, help="timed steps (the job runs warmup + steps)")
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--no-bench", action="store_true", help="skip the bench.gpu_grpo row")
    p.add_argument("--timeout", type=float, default=1200, help="seconds to wait for the job")
    p.add_argument("--json", default=None, help="also write both rows (and what came back) as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from bench.gpu_grpo import parse as grpo_parse
    from bench.gpu_grpo import workload

    shared = ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    if args.tiny:
        shared.append("--tiny")
    if args.micro_batch:
        shared += ["--micro-batch", str(args.micro_batch)]
    work = workload(grpo_parse([*shared, "--rows", "ours"]))
    cuda = torch.cuda.is_available()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    bench: dict[str, Any] | None = None
    failures: list[str] = []
    if not args.no_bench:
        log("bench.gpu_grpo --rows ours")
        try:
            bench = run_bench_row(shared, log)
        except Exception as exc:  # noqa: BLE001 - the platform row still runs
            failures.append(f"bench: {exc}")
    log("through the platform")
    with tempfile.TemporaryDirectory(prefix="gpu-platform-") as tmp:
        res = run_platform(
            work,
            steps=args.warmup + args.steps,
            cuda=cuda,
            timeout=args.timeout,
            log=log,
            home=Path(tmp) / "home",
        )
    platform = summarize_platform(work, res, args.warmup)
    if res.get("status") != JobStatus.SUCCEEDED:
        failures.append(f"platform job {res.get('status')}: " + "\n".join(res.get("log_tail", [])[-15:]))
    if platform["steps"] != args.warmup + args.steps:
        failures.append(f"{platform['steps']} step times streamed, expected {args.warmup + args.steps}")
    if res.get("streamed", {}).get("perf/step_time") != res.get("stored", {}).get("perf/step_time"):
        failures.append("the streamed step times differ from the stored ones")
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(
        f"device: {name}; torch {torch.__version__}; {work.shape.name}, {work.prompts} prompts x {work.samples} "
        f"samples, {work.prompt_len} prompt + {work.new_tokens} new tokens; {args.warmup} warm-up + "
        f"{args.steps} timed steps; platform start {res['platform_start_s']:.1f} s, pool {res.get('pool')}, "
        f"job {res.get('status')} in {res.get('job_wall_s', 0):.1f} s"
    )
    print(table(bench, platform))
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": bench, "platform": platform, "run": res, "failures": failures}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
