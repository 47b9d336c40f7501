"""One GRPO step on one GPU: ours (megatron backend + fastgen, colocated, weights in place) beside TRL's
GRPOTrainer and plain Hugging Face `generate`, one table.

    python -m bench.gpu_grpo                      # Qwen2-0.5B shape; rows ours,trl,hf-generate (one process each)
    python -m bench.gpu_grpo --rows ours          # one row, in this process
    python -m bench.gpu_grpo --tiny               # a tiny shape and batch: runs anywhere (CPU: gloo, megatron's shims)

The workload (issue 12 item 4): a random-initialised Qwen2-0.5B-shaped model (`bench.gpu_train.SHAPES`: vocab
151,936, tied embeddings), `--prompts` 64 prompts of `--prompt-len` 512 random token ids, `--samples` 8 samples
each, exactly `--new-tokens` 512 new tokens per sample (no EOS), temperature 1, no top-k / top-p; reward = the
share of even token ids in the response (a stand-in: any reward costs nothing next to the rest); GRPO
advantages (group-normalised rewards), no KL term, one optimizer step per rollout (AdamW, lr `--lr`, clip
1.0), and pi_old taken from the training pass itself, detached (the importance ratio is 1), as TRL's
GRPOTrainer takes it when each rollout makes exactly one optimizer step.

Rows:
- **ours**: `MegatronTrainBackend` built as `bench.gpu_train`'s backend row builds it (a folder holding only the
  shape's `config.json`, `random_init=True`, the spec values `bench.gpu_train.backend_values` writes out, with
  padded rows, `bshd`, since every row is `prompt + new` tokens long), its loss the policy loss of
  `runtime.algos.losses` through the `custom-loss-function-path` seam (`on_policy_loss` below: pi_old = this
  pass's log-probs); and `FastGenEngine` in the same process on the same GPU, its weights copied from the
  trainer's at start and after every step by `runtime.weight_sync.in_place.InPlaceWeightSync` from
  `MegatronTrainBackend.iter_device_weights` (GPU to GPU, a version check on every push). A step: generate ->
  rewards, advantages, `RolloutBatch` -> `train_step` (micro-batches of `--micro-batch` rows) -> push weights.
- **trl**: `trl.GRPOTrainer` on a `Qwen2ForCausalLM` of the same shape (bf16 on CUDA, SDPA), HF `generate`
  inside, per-device batch `--micro-batch` x `rows / micro-batch` accumulation steps = one generation batch
  of all rows per optimizer step, `beta=0`, `loss_type="grpo"` (per-sequence means, as ours), lr `--lr`
  (constant, as ours), otherwise TRL's defaults (gradient checkpointing on, logits only for the completion). Its
  prompts are text over a word-level tokenizer with one word per model id (so 512 words = 512 ids); the
  generation is timed by wrapping the model's `generate`.
- **hf-generate**: `bench.gpu_rollout.run_hf` (one warm-up call, then one timed call) on the same model
  shape, prompts and lengths: generation alone.

Columns: generation new tokens/s (all rows' new tokens over the generation's wall time, prefill included);
training tokens/s (rows x (prompt + new) over the training part of the step) and its MFU (6 N tokens / time
/ 790 TFLOP/s, `bench.gpu_train`'s definition: N counts the tied embedding once, attention FLOPs not
counted); the steady step (mean of the `--steps` timed steps after `--warmup` untimed ones), the first step
(compilation and graph capture included), and the step's parts. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.gpu_train import (
    PEAK_TFLOPS,
    SHAPES,
    Cfg,
    Clock,
    Shape,
    _peak_gib,
    _reset_peak,
    backend_values,
    qwen2_config,
)

ROWS = ("ours", "trl", "hf-generate")
TARGET_GEN_TOKENS_PER_S = 150_000  # issue 12 item 4
TARGET_STEP_S = 5.9  # 3x faster than TRL's 17.7 s (../shared/NOTES.md)


@dataclass
class Workload:
    shape: Shape
    prompts: int = 64
    samples: int = 8
    prompt_len: int = 512
    new_tokens: int = 512
    micro_batch: int = 16
    warmup: int = 1
    steps: int = 3
    lr: float = 1e-6
    seed: int = 1234
    decode_attention: str | None = None  # fastgen's (None: its default)
    profile: int = 0  # rows of a profiler table of the last step's generation (0: none)
    again: int = 0  # generations after the steps with no training between (the engine alone, same process)

    @property
    def rows(self) -> int:
        return self.prompts * self.samples

    @property
    def seq(self) -> int:
        return self.prompt_len + self.new_tokens

    def prompt_ids(self) -> torch.Tensor:
        """[prompts, prompt_len] random ids in [2, vocab) (0 and 1 stay free for padding and EOS)."""
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randint(2, self.shape.vocab, (self.prompts, self.prompt_len), generator=gen)

    def train_cfg(self) -> Cfg:
        """`bench.gpu_train`'s configuration for the training part (what `backend_values` reads)."""
        return Cfg(
            micro_batch=self.micro_batch,
            seq=self.seq,
            accum=self.rows // self.micro_batch,
            chunk_tokens=min(4096, self.micro_batch * self.seq),
            lr=self.lr,
            seed=self.seed,
            qkv_format="bshd",
        )


def on_policy_loss(inputs: Any, config: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss (GRPO's clipped surrogate) with pi_old = this pass's log-probs, detached: TRL's
    GRPOTrainer's choice when a rollout makes one optimizer step (no separate forward for old log-probs).
    A `custom-loss-function-path` hook (`bench.gpu_grpo:on_policy_loss`)."""
    from runtime.algos.losses import policy_loss

    return policy_loss(dataclasses.replace(inputs, old_log_probs=inputs.log_probs.detach()), config)


def response_rewards(responses: torch.Tensor) -> torch.Tensor:
    """[rows, new] ids -> [rows]: the share of even ids (a cheap stand-in reward with spread within a group)."""
    return (responses % 2 == 0).float().mean(dim=1)


def tflops(params: int, tokens: int, seconds: float) -> float:
    return 6 * params * tokens / seconds / 1e12


def _steady(times: Sequence[float], warmup: int) -> float:
    timed = list(times[warmup:]) or list(times[-1:])
    return sum(timed) / len(timed)


# ----------------------------------------------------------------------------------------------------- ours


def grpo_batch(prompts: torch.Tensor, results: Sequence[Any], work: Workload) -> Any:
    """A `RolloutBatch` of every sample (prompt + response, all the same length), with rewards and GRPO
    advantages (`runtime.algos.advantages`)."""
    from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages
    from runtime.types import RolloutBatch

    rows, p, n = work.rows, work.prompt_len, work.new_tokens
    responses = torch.tensor([r.token_ids for r in results], dtype=torch.long)
    if responses.shape != (rows, n):
        raise RuntimeError(f"expected {rows} responses of exactly {n} tokens, got {tuple(responses.shape)}")
    tokens = torch.cat([prompts.repeat_interleave(work.samples, dim=0), responses], dim=1)
    loss_mask = torch.zeros(rows, p + n)
    loss_mask[:, p:] = 1.0
    rollout_log_probs = torch.zeros(rows, p + n)
    rollout_log_probs[:, p:] = torch.tensor([r.log_probs for r in results])
    group_index = torch.arange(work.prompts).repeat_interleave(work.samples)
    rewards = response_rewards(responses)
    advantages = compute_advantages(
        "grpo",
        AdvantageInputs(rewards=rewards, group_index=group_index, loss_mask=loss_mask),
        AdvantageConfig(),
    ).advantages
    return RolloutBatch(
        tokens=tokens,
        attention_mask=torch.ones(rows, p + n, dtype=torch.long),
        loss_mask=loss_mask,
        group_index=group_index,
        rewards=rewards,
        rollout_log_probs=rollout_log_probs,
        advantages=advantages,
    )


def build_ours(work: Workload, folder: str) -> tuple[Any, Any]:
    """The backend (its own process group: world 1 on a free loopback port) and the colocated engine."""
    from runtime.algos.losses import LossConfig
    from runtime.devices import Device
    from runtime.rollout.fastgen import FastGenEngine
    from runtime.train.base import TrainContext
    from runtime.train.megatron.backend import MegatronTrainBackend
    from runtime.train.megatron.parallel import free_port
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig

    cfg = work.train_cfg()
    hf_config = qwen2_config(work.shape, cfg)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config, f)
    values = {**backend_values(work.shape, cfg, tp=1), "loss_type": "custom_loss"}
    config = TrainConfig(
        loss_type="custom_loss",
        loss=LossConfig(custom_loss_function_path="bench.gpu_grpo:on_policy_loss"),
        lr_schedule=LRSchedule(lr=work.lr),
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        clip_grad=1.0,
        seed=work.seed,
        global_batch_size=work.rows,  # one optimizer step per rollout
        micro_batch_size=work.micro_batch,
        max_tokens_per_micro_batch=work.micro_batch * work.seq,
    )
    device = Device.detect()
    context = TrainContext(0, 1, master_port=free_port(), values=values)
    backend = MegatronTrainBackend(folder, config, device=device, context=context, random_init=True)
    cuda = device.torch_device.type == "cuda"
    engine = FastGenEngine(
        None,
        device=device,
        max_batch_size=work.rows,
        eos_token_ids=(),  # exactly new_tokens each
        dtype=torch.bfloat16 if cuda else torch.float32,
        decode_attention=work.decode_attention,
        _config={**hf_config, "eos_token_id": None},
        _tensors=dict(backend.iter_device_weights()),
    )
    return backend, engine


class CollectorTime:
    """A `gc.callbacks` entry summing the seconds Python's cyclic garbage collector runs (every generation)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def _stats(engine: Any) -> str:
    st = engine.stats
    return (
        f"{st.decode_steps} decode steps, {st.graph_captures} graph captures, {st.compactions} compactions, "
        f"{st.shared_steps} shared steps{_allocator()}"
    )


def _allocator() -> str:
    """The CUDA caching allocator's running counts (cudaMalloc/cudaFree calls, retries after freeing its
    cache, reserved GiB): a generate that frees and re-reserves device memory shows here ("" off CUDA)."""
    if not torch.cuda.is_available():
        return ""
    m = torch.cuda.memory_stats()
    return (
        f"; allocator: {m.get('num_device_alloc', 0)} cudaMalloc, {m.get('num_device_free', 0)} cudaFree, "
        f"{m.get('num_alloc_retries', 0)} retries, {m.get('reserved_bytes.all.current', 0) / 2**30:.1f} GiB reserved"
    )


def _profiled(call: Callable[[], Any], rows: int, log: Callable[[str], None]) -> Any:
    """`call()` under torch.profiler: a table of the `rows` costliest ops by device time (CPU time where no
    GPU), and how much of the wall time the device was busy (kernels' own time, summed)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    started = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        out = call()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - started
    averages = prof.key_averages()
    log(averages.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=rows))
    if cuda:
        busy = sum(e.self_device_time_total for e in averages) / 1e6
        log(f"  profiled generate: {wall:.3f} s wall, device busy {busy:.3f} s ({100 * busy / wall:.0f}%)")
    return out


def run_ours(work: Workload, log: Callable[[str], None]) -> dict[str, Any]:
    from runtime.rollout.params import SamplingParams
    from runtime.train.megatron.parallel import destroy_parallel
    from runtime.weight_sync.in_place import InPlaceWeightSync

    t_build = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as folder:
        backend, engine = build_ours(work, folder)
    device = engine.torch_device
    _reset_peak(device)
    log(
        f"  built in {time.perf_counter() - t_build:.1f} s: backend ({backend.compiled_layers} layers compiled, "
        f"{backend.model_config.params_dtype}), fastgen ({engine.dtype}, {engine.decoder.decode_attention})"
    )
    sync = InPlaceWeightSync(engine)
    clock = Clock(device)
    prompts = work.prompt_ids()
    prompt_lists = prompts.repeat_interleave(work.samples, dim=0).tolist()
    start_weights = engine.weights.flat.detach().float().clone()
    parts: dict[str, list[float]] = {"generate": [], "batch": [], "train": [], "sync": [], "step": []}
    losses: list[float] = []
    grad_norms: list[float] = []
    versions: list[int] = [engine.weight_version]
    collector = CollectorTime()
    gc.callbacks.append(collector)
    for step in range(work.warmup + work.steps):
        t0 = clock.now()
        params = SamplingParams(temperature=1.0, max_new_tokens=work.new_tokens, seed=work.seed + step)
        gc_before = collector.seconds
        results = engine.generate(prompt_lists, params)
        gc_generate = collector.seconds - gc_before
        t1 = clock.now()
        batch = grpo_batch(prompts, results, work)
        t2 = clock.now()
        metrics = backend.train_step(batch)
        t3 = clock.now()
        update = sync.push(backend.iter_device_weights(), version=engine.weight_version + 1)
        t4 = clock.now()
        for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0), strict=True):
            parts[name].append(seconds)
        losses.append(float(metrics["loss"]))
        grad_norms.append(float(metrics["grad_norm"]))
        versions.append(update.version)
        log(
            f"  step {step}: {t4 - t0:.3f} s (generate {t1 - t0:.3f}, batch {t2 - t1:.3f}, train {t3 - t2:.3f}, "
            f"sync {t4 - t3:.3f}: {update.tensors} tensors, {update.bytes / 2**20:.0f} MiB) loss {losses[-1]:.5f} "
            f"reward {float(batch.rewards.mean()):.4f}; Python's garbage collector {gc_generate:.3f} s in generate, "
            f"{collector.seconds - gc_before - gc_generate:.3f} s in the rest of the step; engine {_stats(engine)}"
        )
    if work.profile:  # untimed: one more step's training and push, then its generation under the profiler
        backend.train_step(batch)
        sync.push(backend.iter_device_weights(), version=engine.weight_version + 1)
        _profiled(functools.partial(engine.generate, prompt_lists, params), work.profile, log)
    again = []
    for n in range(work.again):  # the same engine and process, nothing between: what the steps add
        t0 = clock.now()
        engine.generate(prompt_lists, SamplingParams(temperature=1.0, max_new_tokens=work.new_tokens, seed=n))
        again.append(clock.now() - t0)
        log(f"  generate again, no training between: {again[-1]:.3f} s; engine {_stats(engine)}")
    # the engine holds exactly the trainer's weights after the last push, and they moved since the start
    trainer = dict(backend.iter_device_weights())
    mismatch = max(
        float((engine.weights.target(name).float() - tensor.float()).abs().max())
        for name, tensor in trainer.items()
        if name in engine.weights.hf
    )
    changed = float((engine.weights.flat.float() - start_weights).abs().max())
    peak = _peak_gib(device)
    optimizer_steps = backend.optimizer_steps
    del backend, engine, trainer
    destroy_parallel()
    return {
        "parts": parts,
        "losses": losses,
        "grad_norms": grad_norms,
        "weight_versions": versions,
        "engine_vs_trainer_max_abs": mismatch,
        "generate_again_s": again,
        "weights_moved_max_abs": changed,
        "optimizer_steps": optimizer_steps,
        "peak_gib": peak,
    }


# ------------------------------------------------------------------------------------------------ HF model


def hf_model(work: Workload, device: torch.device) -> Any:
    """A random-initialised `Qwen2ForCausalLM` of the shape (SDPA; bf16 on CUDA, fp32 on CPU), no EOS."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **{**qwen2_config(work.shape, work.train_cfg()), "eos_token_id": None, "pad_token_id": 0}
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(work.seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)


def run_hf_generate(work: Workload, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    from bench.gpu_rollout import run_hf

    model = hf_model(work, device).eval()
    prompts = work.prompt_ids().repeat_interleave(work.samples, dim=0).tolist()
    args = argparse.Namespace(temperature=1.0, new_tokens=work.new_tokens, hf_batch=work.rows)
    _reset_peak(device)
    started = time.perf_counter()
    row = run_hf(model, prompts, args)
    log(f"  HF generate: {row.wall_s:.3f} s timed ({time.perf_counter() - started:.1f} s with warm-up)")
    return {"parts": {"generate": [row.wall_s], "step": [row.wall_s]}, "peak_gib": _peak_gib(device)}


# ------------------------------------------------------------------------------------------------------ TRL


def word_tokenizer(vocab: int) -> Any:
    """One word per model id, split on spaces (`<pad>` = 0, `<eos>` = 1, `t2` .. `t{vocab-1}`): a prompt of k
    words is k ids. The special tokens share no prefix with the words (an added token `t1` would split `t17`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, vocab)}}
    core = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<pad>"
    )


def run_trl(work: Workload, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = hf_model(work, device)
    clock = Clock(device)
    gen_times: list[float] = []
    generate = model.generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t0 = clock.now()
        out = generate(*args, **kwargs)
        gen_times.append(clock.now() - t0)
        return out

    model.generate = timed_generate  # TRL calls the (unwrapped) model's generate
    texts = [" ".join(f"t{i}" for i in row) for row in work.prompt_ids().tolist()]
    step_times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = clock.now()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_times.append(clock.now() - self.t0)
            log(
                f"  step {len(step_times) - 1}: {step_times[-1]:.3f} s (generate {sum(gen_times):.3f} so far)"
            )

    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=work.micro_batch,
            gradient_accumulation_steps=work.rows // work.micro_batch,
            num_generations=work.samples,
            max_completion_length=work.new_tokens,
            generation_kwargs={"min_new_tokens": work.new_tokens},  # exactly new_tokens (EOS suppressed)
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            beta=0.0,
            loss_type="grpo",
            learning_rate=work.lr,
            lr_scheduler_type="constant",  # as ours
            max_grad_norm=1.0,
            max_steps=work.warmup + work.steps,
            bf16=cuda,
            use_cpu=not cuda,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=work.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [
                sum(w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in c.split()) / max(1, len(c.split()))
                for c in completions
            ],
            args=config,
            # a fixed fingerprint: datasets does not hash the table (its hashing fails with some pyarrow builds)
            train_dataset=Dataset(
                InMemoryTable.from_pydict({"prompt": texts}), fingerprint="bench-grpo-prompts"
            ),
            processing_class=word_tokenizer(work.shape.vocab),
            callbacks=[Timer()],
        )
        _reset_peak(device)
        trainer.train()
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    seen = [int(h["num_tokens"]) for h in trainer.state.log_history if "num_tokens" in h]
    if seen[:1] != [work.rows * work.seq]:  # prompt + completion tokens of the first step, as TRL counts them
        raise RuntimeError(f"TRL's first step saw {seen[:1]} tokens, expected {work.rows * work.seq}")
    if len(gen_times) != len(step_times):
        raise RuntimeError(f"{len(gen_times)} generate calls for {len(step_times)} steps (expected one each)")
    train = [s - g for s, g in zip(step_times, gen_times, strict=True)]
    return {
        "parts": {"generate": gen_times, "train": train, "step": step_times},
        "losses": losses,
        "peak_gib": _peak_gib(device),
    }


# ----------------------------------------------------------------------------------------------------- table

LABELS = {
    "ours": "ours: megatron backend + fastgen, colocated, weights in place",
    "trl": "TRL GRPOTrainer (HF generate + HF training, TRL's defaults: gradient checkpointing)",
    "hf-generate": "plain HF generate (generation only)",
}


def summarize(which: str, work: Workload, res: dict[str, Any]) -> dict[str, Any]:
    parts = {name: _steady(times, work.warmup) for name, times in res["parts"].items() if times}
    first = {name: times[0] for name, times in res["parts"].items() if times}
    n = work.shape.params()
    out: dict[str, Any] = {
        "row": which,
        "loop": LABELS[which],
        "model": f"{work.shape.name} (N={n / 1e6:,.1f}M)",
        "gen_tokens_per_s": work.rows * work.new_tokens / parts["generate"],
        "generate_s": parts["generate"],
        "step_s": parts["step"],
        "first_step_s": first["step"] if which != "hf-generate" else None,
        "parts_s": parts,
        "first_parts_s": first,
        **{k: v for k, v in res.items() if k != "parts"},
    }
    if "train" in parts:
        tokens = work.rows * work.seq
        out["train_tokens_per_s"] = tokens / parts["train"]
        out["train_mfu"] = tflops(n, tokens, parts["train"]) / PEAK_TFLOPS
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = "| loop | gen new tok/s | generate s | train tok/s | train MFU | batch + sync s | step s | first step s | peak GiB |"
    out = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parts = r["parts_s"]
        other = f"{parts['step'] - parts['generate'] - parts['train']:.3f}" if "sync" in parts else ""
        train = f"{r['train_tokens_per_s'] / 1e3:,.1f}k" if "train_tokens_per_s" in r else ""
        mfu = f"{100 * r['train_mfu']:.1f}%" if "train_mfu" in r else ""
        first = "" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}"
        peak = "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        out.append(
            f"| {r['loop']} | {r['gen_tokens_per_s'] / 1e3:,.1f}k | {parts['generate']:.3f} | {train} | {mfu} | "
            f"{other} | {parts['step']:.3f} | {first} | {peak} |"
        )
    return "\n".join(out)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets against the `ours` row (and against TRL's step when it ran)."""
    lines: list[str] = []
    ours = next((r for r in rows if r["row"] == "ours"), None)
    trl = next((r for r in rows if r["row"] == "trl"), None)
    if ours is None:
        return lines
    gen, step = ours["gen_tokens_per_s"], ours["step_s"]
    lines.append(
        f"target generation >= {TARGET_GEN_TOKENS_PER_S / 1e3:.0f}k new tok/s: {gen / 1e3:,.1f}k "
        f"({'met' if gen >= TARGET_GEN_TOKENS_PER_S else f'missed by {100 * (1 - gen / TARGET_GEN_TOKENS_PER_S):.1f}%'})"
    )
    lines.append(
        f"target GRPO step <= {TARGET_STEP_S} s: {step:.3f} s "
        f"({'met' if step <= TARGET_STEP_S else f'missed by {step - TARGET_STEP_S:.3f} s'})"
    )
    if trl is not None:
        lines.append(f"TRL step / ours: {trl['step_s'] / step:.2f}x")
    return lines


# ------------------------------------------------------------------------------------------------------ main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_grpo", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help="comma list of: " + ",".join(ROWS))
    p.add_argument("--tiny", action="store_true", help="tiny shape; 4 prompts x 4 samples x (16 + 16) tokens")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None, help="training rows per micro-batch (16)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps (the first is reported apart)")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument(
        "--decode-attention", default=None, help="fastgen's decode attention for ours (default: fastgen's)"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="ours: after the steps, one more (untimed) with its generate profiled",
    )
    p.add_argument(
        "--again", type=int, default=0, help="ours: N more generations after the steps, no training between"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every row in this process (default: one process per row)",
    )
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def workload(args: argparse.Namespace) -> Workload:
    tiny = args.tiny
    pick = lambda value, full, small: value if value is not None else (small if tiny else full)  # noqa: E731
    return Workload(
        shape=SHAPES["tiny" if tiny else "0.5b"],
        prompts=pick(args.prompts, 64, 4),
        samples=pick(args.samples, 8, 4),
        prompt_len=pick(args.prompt_len, 512, 16),
        new_tokens=pick(args.new_tokens, 512, 16),
        micro_batch=pick(args.micro_batch, 16, 4),
        warmup=args.warmup,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        decode_attention=args.decode_attention,
        profile=args.profile,
        again=args.again,
    )


def _row_in_subprocess(which: str, argv: Sequence[str], log: Callable[[str], None]) -> dict[str, Any]:
    """One row in a fresh interpreter (its own CUDA memory, compile caches and process group)."""
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--rows", "--json"):
            skip = True
            continue
        if not arg.startswith(("--rows=", "--json=")):
            rest.append(arg)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-row-") as folder:
        path = os.path.join(folder, "row.json")
        cmd = [sys.executable, "-m", "bench.gpu_grpo", *rest, "--rows", which, "--json", path, "--in-process"]
        done = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"row {which} exited with {done.returncode}: {done.stdout[-2000:]}")
        log(done.stdout.rstrip())
        with open(path) as f:
            return json.load(f)[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    work = workload(args)
    wanted = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(wanted) - set(ROWS))
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for which in wanted:
        log(f"{work.shape.name}: {which}")
        try:
            if len(wanted) > 1 and not args.in_process:
                rows.append(_row_in_subprocess(which, argv, log))
            else:
                run = {
                    "ours": lambda: run_ours(work, log),
                    "trl": lambda: run_trl(work, device, log),
                    "hf-generate": lambda: run_hf_generate(work, device, log),
                }[which]
                rows.append(summarize(which, work, run()))
                _reset_peak(device)
        except Exception as exc:  # one broken row must not cost the others (one GPU call runs them all)
            import traceback

            log(traceback.format_exc())
            failures.append(f"{which}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"device: {name}; torch {torch.__version__}; {work.shape.name}, {work.prompts} prompts x {work.samples} "
        f"samples, {work.prompt_len} prompt + exactly {work.new_tokens} new tokens; {work.warmup} warm-up + "
        f"{work.steps} timed steps"
    )
    print(table(rows))
    for line in verdict(rows):
        print(line)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
