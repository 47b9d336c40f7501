"""Training throughput of the Megatron backend's model path against a plain Hugging Face loop, one table.

    python -m bench.gpu_train                       # Qwen2-0.5B and Qwen2.5-1.5B shapes, rows hf,ours,ours-save
    python -m bench.gpu_train --rows hf,backend     # the backend itself (MegatronTrainBackend.train_step)
    python -m bench.gpu_train --micro               # first a table of the levers one at a time (CUDA)
    python -m bench.gpu_train --tiny                # a tiny shape, runs anywhere (CPU: gloo + megatron's CPU shims)
    torchrun --nproc-per-node 2 -m bench.gpu_train --tp 2     # (or --dp 2) ours/backend rows, over NCCL (gloo on CPU)

Rows (same shapes, random init, bf16 weights, micro-batches of `--micro-batch` x `--seq` tokens, `--accum`
micro-batches per optimizer step, `--warmup` untimed steps then `--steps` timed ones):

- **ours**: the backend's model path, `runtime.train.megatron.model` (`ModelArgs` -> `transformer_config` ->
  `build_model`: megatron-core `GPTModel`, local layer spec, `attention.SDPAttention`), cast to bf16 as
  megatron's Float16Module does, with `kernels.cuda_fusions` (megatron's torch.compile'd SwiGLU and
  bias-dropout-add) and `kernels.compile_transformer_layers`; if model.py cannot build, a GPTModel built here
  the same way (`--builder`). The loss comes from `kernels.token_log_probs_and_entropy` (chunked
  vocab-parallel head, never full fp32 logits): loss = -mean(log p) - 1e-3 * mean(entropy). Megatron DDP
  (grads accumulated in fp32) and megatron's DistributedOptimizer (fp32 main params; its Adam is
  torch.optim.AdamW without TE/apex), clip 1.0. `ours-save`: the same with the head's `save_logits=True`;
  `ours-eager`: without torch.compile of the layers.
- **backend**: `runtime.train.megatron.backend.MegatronTrainBackend` itself, built as a job builds it: a
  `TrainContext` whose values are the spec's (by dest: `bf16`, dropout 0, `accumulate-allreduce-grads-in-fp32`,
  `log-probs-chunk-size`, the TP size, `use-dynamic-batch-size` with `max-tokens-per-gpu` = micro-batch x seq,
  as SFT specs need), a `TrainConfig` (loss type `sft`, lr, Adam betas 0.9/0.95, clip 1.0, global batch =
  micro-batch x accum x dp rows), and `hf_checkpoint` a temporary folder
  holding only the shape's Qwen2 `config.json`, with `random_init=True` (megatron's own initialisation instead
  of loading weights). Each timed step is one `train_step` on one `RolloutBatch` of `micro-batch x accum x dp`
  rows of `seq` random tokens (loss on every token but the first): the backend's own micro-batching,
  megatron's forward/backward schedule, `runtime.algos.losses`' SFT loss, the distributed optimizer and its
  lr schedule. Whatever the backend does on CUDA (bf16, compiled layers, fusions, the head keeping logits when
  they fit) is what is measured. `backend-recompute` / `backend-save`: the same with `RELAX_HEAD_SAVE_LOGITS`
  0 / 1 (the head recomputes / keeps its logits whatever the memory estimate says). `--qkv-format`: each
  micro-batch as one pack of its rows (`thd`, Relax's default: varlen flash attention) or as padded rows
  (`bshd`); `--cp N` under torchrun: context parallelism (each micro-batch's tokens split over N GPUs).
- **hf** (plain HF): `transformers` `Qwen2ForCausalLM` (SDPA attention), bf16 weights, `model.model.compile()`
  (the transformer body), and a chunked cross-entropy: 2048-row chunks of the final hidden states, each chunk's
  logits made in bf16, upcast, cross-entropy, under activation checkpointing (so full fp32 logits never exist);
  torch.optim.AdamW(fused=True) over the bf16 weights, clip 1.0.

MFU = 6 * N * tokens / time / peak (peak 790 TFLOP/s bf16 dense, measured on the H200; attention FLOPs are not
counted). N counts the tied embedding once (0.5B: 494,032,768; 1.5B: 1,543,714,304). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bench.harness import environ

PEAK_TFLOPS = 790.0
# backend rows -> RELAX_HEAD_SAVE_LOGITS for the row (None: the backend's own memory estimate decides)
BACKEND_ROWS: dict[str, str | None] = {"backend": None, "backend-recompute": "0", "backend-save": "1"}


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = True
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameter count, the tied embedding once."""
        h, d = self.hidden, self.head_dim
        qkv_out = (self.heads + 2 * self.kv_heads) * d
        per_layer = (
            h * qkv_out + (qkv_out if self.qkv_bias else 0) + self.heads * d * h + 3 * h * self.ffn + 2 * h
        )
        emb = self.vocab * h * (1 if self.tied else 2)
        return self.layers * per_layer + emb + h


# Public configs: Qwen/Qwen2-0.5B and Qwen/Qwen2.5-1.5B config.json (hidden_size, num_hidden_layers, ...).
SHAPES = {
    "0.5b": Shape("Qwen2-0.5B", 896, 24, 14, 2, 4864, 151936),
    "1.5b": Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936),
    "tiny": Shape("tiny", 64, 2, 4, 2, 128, 1000),
}


@dataclass
class Cfg:
    micro_batch: int = 16
    seq: int = 1024
    accum: int = 8
    warmup: int = 2
    steps: int = 5
    chunk_tokens: int = 4096
    hf_chunk: int = 2048
    compile: bool = True
    compile_backend: str | None = None  # None: inductor on CUDA, nothing on CPU
    save_logits: bool = False
    sdpa: str = "auto"  # auto | cudnn | flash | efficient
    fusions: bool | None = None  # megatron's torch.compile'd SwiGLU / bias-dropout-add; None: on CUDA only
    lr: float = 1e-5
    seed: int = 1234
    builder: str = "auto"  # auto (model.py, else direct) | model | direct
    cp: int = 1  # backend rows: context-parallel size (tp x cp x dp = world)
    qkv_format: str = "thd"  # backend rows: packed sequences (Relax's default) or padded rows (bshd)
    profile: str | None = None  # write one profiled step's kernel table here


# ---------------------------------------------------------------------------------------------- timing


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


def _reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _random_batches(
    shape: Shape, cfg: Cfg, device: torch.device, gen: torch.Generator
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """`cfg.accum` micro-batches of random (ids, targets) [micro_batch, seq] drawn from `gen`, and the
    position ids [micro_batch, seq] they share."""
    b, s = cfg.micro_batch, cfg.seq
    batches = [
        (
            torch.randint(0, shape.vocab, (b, s), device=device, generator=gen),
            torch.randint(0, shape.vocab, (b, s), device=device, generator=gen),
        )
        for _ in range(cfg.accum)
    ]
    return batches, torch.arange(s, device=device).unsqueeze(0).expand(b, s)


def _peak_gib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def profile_step(step: Callable[[], float], device: torch.device, path: str, rows: int = 30) -> None:
    """One more step under torch.profiler: the kernels by total device time, written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        Clock(device).sync()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    text = prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)
    if device.type == "cuda":
        text += "\n" + idle_gaps(prof.events())
    with open(path, "w") as f:
        f.write(text)


def idle_gaps(events: Any, min_us: float = 20.0, rows: int = 30) -> str:
    """Where the device waits for the host during the profiled step: every gap of at least `min_us` between
    kernels (or copies), charged to the host ops that were running when the device went idle (the
    innermost op and its outermost caller), summed and sorted. A kernel table cannot show this: a step whose
    kernels take 920 ms can take 1,000 ms."""
    from torch.autograd import DeviceType

    device_ops = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    host_ops = sorted(
        (e for e in events if e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start
    )
    starts = [e.time_range.start for e in host_ops]
    if not device_ops:
        return "no device activity recorded\n"
    busy_until, gaps = device_ops[0][1], []
    for start, end in device_ops[1:]:
        if start - busy_until >= min_us:
            gaps.append((busy_until, start))
        busy_until = max(busy_until, end)
    window = busy_until - device_ops[0][0]
    charged: dict[str, list[float]] = {}
    for start, end in gaps:
        # host ops under way at `start`: started before it (the last 2,000 of them, nested calls are recent)
        # and not yet ended, outermost first
        last = bisect.bisect_right(starts, start)
        running = [e for e in host_ops[max(0, last - 2000) : last] if e.time_range.end > start]
        outer = running[0].name if running else "(no host op)"
        inner = running[-1].name if running else "(no host op)"
        label = outer if outer == inner else f"{outer[:40]} > {inner[:50]}"
        charged.setdefault(label, []).append(end - start)
    idle = sum(end - start for start, end in gaps)
    lines = [
        f"device idle in gaps >= {min_us:.0f} us: {idle / 1e3:.1f} ms of {window / 1e3:.1f} ms "
        f"({len(gaps)} gaps), by the host op running when the device went idle:",
        "| host op (outermost > innermost) | gaps | idle ms |",
        "|---|---|---|",
    ]
    for label, times in sorted(charged.items(), key=lambda kv: -sum(kv[1]))[:rows]:
        lines.append(f"| {label} | {len(times)} | {sum(times) / 1e3:.1f} |")
    return "\n".join(lines) + "\n"


def measure(
    step: Callable[[], float], cfg: Cfg, device: torch.device, log: Callable[[str], None]
) -> dict[str, Any]:
    clock = Clock(device)
    times: list[float] = []
    losses: list[float] = []
    for i in range(cfg.warmup + cfg.steps):
        t0 = clock.now()
        loss = step()
        times.append(clock.now() - t0)
        losses.append(loss)
        log(f"  step {i}: {times[-1]:.3f} s loss {loss:.4f}")
    timed = times[cfg.warmup :] or times[-1:]
    if cfg.profile:
        profile_step(step, device, cfg.profile)
        log(f"  profile written to {cfg.profile}")
    return {
        "first_step_s": times[0],
        "step_s": sum(timed) / len(timed),
        "step_min_s": min(timed),
        "losses": losses,
    }


def _sdpa_context(choice: str):
    import contextlib

    if choice == "auto" or not torch.cuda.is_available():
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = {
        "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
        "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION],
    }[choice]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # older torch: no priority order
        return sdpa_kernel(order)


# -------------------------------------------------------------------------------------------- ours


def _megatron_config(shape: Shape, tp: int, dtype: torch.dtype, on_cuda: bool, fusions: bool):
    from megatron.core.transformer.transformer_config import TransformerConfig

    wanted: dict[str, Any] = dict(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=shape.eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not on_cuda,
        # megatron's own torch.compile'd SwiGLU and bias-dropout-add (no TE/apex needed); off on CPU
        bias_activation_fusion=fusions,
        bias_dropout_fusion=fusions,
        # these need TE / apex / CUDA extensions
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
    )
    known = {f.name for f in fields(TransformerConfig)}
    return TransformerConfig(**{k: v for k, v in wanted.items() if k in known})


def _layer_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from runtime.train.megatron.attention import SDPAttention
    from runtime.train.megatron.kernels import RMSNorm

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    sub = spec.submodules
    sub.self_attention.submodules.core_attention = SDPAttention
    sub.input_layernorm = RMSNorm
    sub.pre_mlp_layernorm = RMSNorm
    return spec


def _build_gpt(shape: Shape, tp: int, dtype: torch.dtype, on_cuda: bool, seq: int, fusions: bool):
    """megatron-core GPTModel for `shape` (the backend's model.py, when it exists, builds the same thing)."""
    from megatron.core.models.gpt import GPTModel

    config = _megatron_config(shape, tp, dtype, on_cuda, fusions)
    model = GPTModel(
        config=config,
        transformer_layer_spec=_layer_spec(),
        vocab_size=shape.vocab,
        max_sequence_length=seq,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    model.to(dtype)  # as megatron's Float16Module does: every parameter (the block's final norm too) in bf16
    if on_cuda:
        model.cuda(torch.cuda.current_device())
    return model


def _build_with_model_py(shape: Shape, tp: int, world: int, dtype: torch.dtype, seq: int, fusions: bool):
    """The backend's own path: `ModelArgs` -> `transformer_config` -> `build_model` (runtime.train.megatron.model),
    plus megatron's torch.compile'd fusions (`kernels.cuda_fusions`) where `fusions`."""
    from runtime.train.megatron import model as mm
    from runtime.train.megatron.kernels import cuda_fusions
    from runtime.train.megatron.parallel import ParallelLayout

    args = mm.ModelArgs(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        ffn_hidden_size=shape.ffn,
        num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads,
        kv_channels=shape.head_dim,
        vocab_size=shape.vocab,
        max_position_embeddings=max(seq, 4096),
        rotary_base=shape.rope_theta,
        norm_epsilon=shape.eps,
        add_qkv_bias=shape.qkv_bias,
        untie_embeddings_and_output_weights=not shape.tied,
    )
    layout = ParallelLayout(tp=tp, world_size=world)
    values = {"bf16": dtype is torch.bfloat16, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    config = mm.transformer_config(args, layout, values=values)
    if fusions:
        config = cuda_fusions(config)
    (gpt,) = mm.build_model(args, layout, config)
    gpt.to(dtype)  # as megatron's Float16Module does (the block's final norm is built in fp32 otherwise)
    return gpt


def _hidden_only(gpt) -> None:
    """Make `gpt(...)` return the final (normed) hidden states `[b, s, h]` instead of logits: the loss head
    takes them with the output weight. The output layer stays registered (its weight, if untied, still trains
    through the head)."""
    gpt.output_layer.forward = lambda hidden_states, weight=None, runtime_gather_output=None: (
        hidden_states,
        None,
    )


def _output_weight(gpt) -> torch.Tensor:
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()
    return gpt.output_layer.weight


def run_ours(
    shape: Shape, cfg: Cfg, tp: int, device: torch.device, log: Callable[[str], None]
) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from runtime.train.megatron.kernels import compile_transformer_layers, token_log_probs_and_entropy

    on_cuda = device.type == "cuda"
    dtype = torch.bfloat16
    torch.manual_seed(cfg.seed)
    _reset_peak(device)
    t_build = time.perf_counter()
    fusions = on_cuda if cfg.fusions is None else cfg.fusions
    builder = cfg.builder
    if builder in ("auto", "model"):
        try:
            gpt = _build_with_model_py(shape, tp, dist.get_world_size(), dtype, cfg.seq, fusions)
            builder = "model.py"
        except Exception as exc:
            if cfg.builder == "model":
                raise
            log(f"  model.py build failed ({type(exc).__name__}: {exc}); building GPTModel directly")
            builder = "direct"
    if builder == "direct":
        gpt = _build_gpt(shape, tp, dtype, on_cuda, cfg.seq, fusions)
    _hidden_only(gpt)
    compiled = 0
    if cfg.compile:
        compiled = compile_transformer_layers(gpt, backend=cfg.compile_backend)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True
    )
    model = DistributedDataParallel(config=gpt.config, ddp_config=ddp_cfg, module=gpt)
    opt_cfg = OptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        bf16=True,
        params_dtype=dtype,
        use_distributed_optimizer=True,
        clip_grad=1.0,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [model])
    log(
        f"  built ({builder}) in {time.perf_counter() - t_build:.1f} s; {compiled} layers compiled; "
        f"fusions {'on' if gpt.config.bias_dropout_fusion else 'off'}"
    )

    tp_group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    dp_rank = parallel_state.get_data_parallel_rank()
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 7919 * dp_rank)  # same data on a TP group
    batches, position_ids = _random_batches(shape, cfg, device, gen)

    def step() -> float:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        total = torch.zeros((), device=device)
        with _sdpa_context(cfg.sdpa):
            for ids, targets in batches:
                hidden = model(ids, position_ids, None)  # [b, s, h] (see _hidden_only)
                logp, ent = token_log_probs_and_entropy(
                    hidden,
                    _output_weight(gpt),
                    targets,
                    vocab_size=shape.vocab,
                    tp_group=tp_group,
                    chunk_tokens=cfg.chunk_tokens,
                    save_logits=cfg.save_logits,
                )
                loss = -logp.mean() - 1e-3 * ent.mean()
                (loss / cfg.accum).backward()
                total += loss.detach() / cfg.accum
        model.finish_grad_sync()
        ok, _grad_norm, _ = optimizer.step()
        if not ok:
            raise RuntimeError("optimizer step skipped")
        return float(total)

    result = measure(step, cfg, device, log)
    result["peak_gib"] = _peak_gib(device)
    result["builder"] = builder
    return result


# ------------------------------------------------------------------------------------------ backend


def backend_values(shape: Shape, cfg: Cfg, tp: int) -> dict[str, Any]:
    """The spec values (by dest) the backend row's job would have: what `load_spec` derives on the megatron
    backend for a spec setting these (bf16 is Relax's derived default there; Megatron-LM accumulates bf16
    gradients in fp32, as the `ours` rows do). Written out so the bench needs no jobspec (pydantic) on a bare
    GPU image; tests/unit/runtime/megatron/test_bench_backend.py checks them against `load_spec`."""
    return {
        "train_backend": "megatron",
        "optimizer": "adam",
        "bf16": True,
        "fp16": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "init_method_std": 0.02,
        "accumulate_allreduce_grads_in_fp32": True,
        "balance_data": True,  # Relax derives it for SFT (one rank here: nothing to balance)
        "tensor_model_parallel_size": tp,
        "log_probs_chunk_size": cfg.chunk_tokens,
        "seq_length": cfg.seq,
        "micro_batch_size": cfg.micro_batch,
        "loss_type": "sft",
        # SFT specs bound tokens per micro-batch (jobspec's rule.sft_needs_dynamic_batch_size): with rows of
        # `seq` tokens, a budget of micro-batch x seq gives the same micro-batches of `micro_batch` rows
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": cfg.micro_batch * cfg.seq,
        # Megatron-LM's defaults, as the spec carries them (the `ours` rows skip the NaN check)
        "check_for_nan_in_loss_and_grad": True,
        "bias_swiglu_fusion": True,
        "bias_dropout_fusion": True,
        "apply_rope_fusion": True,  # RoPE through megatron's fused-RoPE hook (kernels.precompute_rope)
        "distributed_timeout_minutes": 30,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": cfg.cp,
        # Relax's rule: context parallelism with the per-token loss (the bench's SFT loss averages tokens anyway)
        "calculate_per_token_loss": cfg.cp > 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": tp,
        "qkv_format": cfg.qkv_format,
    }


def qwen2_config(shape: Shape, cfg: Cfg) -> dict[str, Any]:
    """A Hugging Face `config.json` for `shape` (Qwen2 architecture), what `--hf-checkpoint` would hold."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": max(cfg.seq, 4096),
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.eps,
        "tie_word_embeddings": shape.tied,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "torch_dtype": "bfloat16",
    }


def run_backend(
    shape: Shape, cfg: Cfg, tp: int, device: torch.device, log: Callable[[str], None]
) -> dict[str, Any]:
    """`MegatronTrainBackend.train_step` on RolloutBatches of random tokens (see the module docstring)."""
    import tempfile

    from runtime.algos.losses import LossConfig
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class
    from runtime.train.megatron.parallel import ParallelLayout, destroy_parallel, initialize_parallel
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig
    from runtime.types import RolloutBatch

    world = dist.get_world_size()
    dp = world // (tp * cfg.cp)
    b, s = cfg.micro_batch, cfg.seq
    rows = b * cfg.accum * dp  # one optimizer step of `accum` micro-batches on every data-parallel rank
    torch.manual_seed(cfg.seed)
    _reset_peak(device)
    t_build = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-backend-") as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(qwen2_config(shape, cfg), f)
        config = TrainConfig(
            loss_type="sft",
            loss=LossConfig(),
            lr_schedule=LRSchedule(lr=cfg.lr),
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.95,
            clip_grad=1.0,
            seed=cfg.seed,
            global_batch_size=rows,
            micro_batch_size=b,
            # `max-tokens-per-gpu` (see backend_values): a micro-batch holds it x cp tokens under CP, as in Relax
            max_tokens_per_micro_batch=b * s // cfg.cp,
        )
        context = TrainContext(dist.get_rank(), world, values=backend_values(shape, cfg, tp))
        destroy_parallel(process_group=False)  # the backend sets megatron's groups up itself
        try:
            backend = train_backend_class("megatron")(
                folder, config, device=Device.detect(), need_ref=False, context=context, random_init=True
            )
        except Exception:
            from megatron.core import parallel_state

            if not parallel_state.model_parallel_is_initialized():  # leave the groups for the next rows
                initialize_parallel(ParallelLayout(tp=tp, world_size=world), seed=cfg.seed)
            raise
    keeps = backend.keeps_head_logits(b * s // cfg.cp)
    log(
        f"  built (MegatronTrainBackend, random init) in {time.perf_counter() - t_build:.1f} s; "
        f"{backend.compiled_layers} layers compiled; fusions "
        f"{'on' if backend.model_config.bias_dropout_fusion else 'off'}; head "
        f"{'keeps' if keeps else 'recomputes'} logits (budget {backend.head_save_budget / 2**30:.1f} GiB); "
        f"dtype {backend.model_config.params_dtype}"
    )
    gen = torch.Generator().manual_seed(cfg.seed)  # the same batch on every rank (each takes its dp share)
    tokens = torch.randint(0, shape.vocab, (rows, s), generator=gen)
    loss_mask = torch.ones(rows, s)
    loss_mask[:, 0] = 0.0  # nothing predicts the first token
    batch = RolloutBatch(
        tokens=tokens,
        attention_mask=torch.ones(rows, s, dtype=torch.long),
        loss_mask=loss_mask,
        group_index=torch.arange(rows),
        rewards=torch.zeros(rows),
        rollout_log_probs=torch.zeros(rows, s),
    )

    def step() -> float:
        with _sdpa_context(cfg.sdpa):
            metrics = backend.train_step(batch)
        if metrics.get("optimizer_steps") is None:
            raise RuntimeError("train_step made no optimizer step")
        return float(metrics["loss"])

    result = measure(step, cfg, device, log)
    result["peak_gib"] = _peak_gib(device)
    result["head_keeps_logits"] = keeps
    result["compiled_layers"] = backend.compiled_layers
    return result


# ------------------------------------------------------------------------------------------ plain HF


def run_hf(shape: Shape, cfg: Cfg, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    from torch.utils.checkpoint import checkpoint
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(cfg.seed)
    _reset_peak(device)
    hf_cfg = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(cfg.seq, 4096),
        rms_norm_eps=shape.eps,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tied,
        attention_dropout=0.0,
        use_cache=False,
    )
    hf_cfg._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(hf_cfg)
    finally:
        torch.set_default_dtype(previous)
    model.train()
    n_counted = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    if cfg.compile and (device.type == "cuda" or cfg.compile_backend):
        model.model.compile(backend=cfg.compile_backend or "inductor")
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=fused or None
    )
    weight = model.lm_head.weight

    def ce_chunk(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy((h @ w.t()).float(), t, reduction="sum")

    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    batches, position_ids = _random_batches(shape, cfg, device, gen)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for ids, targets in batches:
            hidden = model.model(input_ids=ids, position_ids=position_ids).last_hidden_state
            h2, t1 = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
            loss = hidden.new_zeros((), dtype=torch.float32)
            for a in range(0, h2.shape[0], cfg.hf_chunk):
                loss = loss + checkpoint(
                    ce_chunk, h2[a : a + cfg.hf_chunk], weight, t1[a : a + cfg.hf_chunk], use_reentrant=False
                )
            loss = loss / t1.numel()
            (loss / cfg.accum).backward()
            total += loss.detach() / cfg.accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(total)

    result = measure(step, cfg, device, log)
    result["peak_gib"] = _peak_gib(device)
    result["params_counted"] = n_counted
    return result


# -------------------------------------------------------------------------------------------- table


def row(label: str, shape: Shape, cfg: Cfg, res: dict[str, Any], gpus: int, dp: int) -> dict[str, Any]:
    tokens = cfg.micro_batch * cfg.seq * cfg.accum * dp
    n = shape.params()
    tflops = 6 * n * tokens / res["step_s"] / 1e12 / gpus
    return {
        "model": f"{shape.name} (N={n / 1e6:,.1f}M)",
        "loop": label,
        "step_s": res["step_s"],
        "tokens_per_s": tokens / res["step_s"],
        "tflops_per_gpu": tflops,
        "mfu": tflops / PEAK_TFLOPS,
        "peak_gib": res.get("peak_gib"),
        "first_step_s": res["first_step_s"],
        "losses": res.get("losses"),
        "params": n,
        "gpus": gpus,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = "| model | loop | step s | tokens/s | TFLOP/s (per GPU) | MFU | peak GiB | first step s |"
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        out.append(
            f"| {r['model']} | {r['loop']} | {r['step_s']:.3f} | {r['tokens_per_s'] / 1e3:,.1f}k | "
            f"{r['tflops_per_gpu']:.1f} | {100 * r['mfu']:.1f}% | {peak} | {r['first_step_s']:.1f} |"
        )
    return "\n".join(out)


# --------------------------------------------------------------------------------------- micro-benchmarks


def _time_cuda(fn: Callable[[], Any], reps: int = 10) -> float:
    """Mean milliseconds of `fn` over `reps` runs after two warm-ups (CUDA events; a wall clock on CPU)."""
    for _ in range(2):
        fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def micro(shape: Shape, cfg: Cfg, device: torch.device) -> list[str]:
    """The levers one at a time at the bench's shapes (CUDA): SDPA backends with GQA, the loss head against
    full logits (time, memory, agreement), RMSNorm and SwiGLU paths. Lines of a markdown table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from runtime.train.megatron import kernels

    lines = ["| what | variant | ms (fwd+bwd) | peak GiB | note |", "|---|---|---|---|---|"]
    b, s, h = cfg.micro_batch, cfg.seq, shape.hidden
    d, nh, ng = shape.head_dim, shape.heads, shape.kv_heads
    bf = torch.bfloat16

    cuda = device.type == "cuda"

    def add(what: str, variant: str, fn: Callable[[], Any], note: str = "") -> None:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if cuda else 0
        try:
            ms = _time_cuda(fn)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if cuda else 0.0
            lines.append(f"| {what} | {variant} | {ms:.2f} | {peak:.2f} | {note} |")
        except Exception as exc:  # a backend that cannot run this shape
            lines.append(f"| {what} | {variant} | failed | | {type(exc).__name__}: {str(exc)[:80]} |")

    q = torch.randn(b, nh, s, d, device=device, dtype=bf, requires_grad=True)
    k = torch.randn(b, ng, s, d, device=device, dtype=bf, requires_grad=True)
    v = torch.randn(b, ng, s, d, device=device, dtype=bf, requires_grad=True)
    go = torch.randn(b, nh, s, d, device=device, dtype=bf)
    for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):

        def gqa(backend=backend) -> None:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)

        def expanded(backend=backend) -> None:
            with sdpa_kernel([backend]):
                kk = k.repeat_interleave(nh // ng, dim=1)
                vv = v.repeat_interleave(nh // ng, dim=1)
                F.scaled_dot_product_attention(q, kk, vv, is_causal=True).backward(go)

        add(f"SDPA causal {b}x{nh}h/{ng}kv x{s}", f"{name}, enable_gqa", gqa)
        add(f"SDPA causal {b}x{nh}h/{ng}kv x{s}", f"{name}, kv expanded", expanded)

    def auto() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)

    add(f"SDPA causal {b}x{nh}h/{ng}kv x{s}", "default choice, enable_gqa", auto)

    n_tok = b * s
    gen = torch.Generator(device=device).manual_seed(0)
    hid = (torch.randn(n_tok, h, device=device, dtype=bf, generator=gen)).requires_grad_(True)
    w = (torch.randn(shape.vocab, h, device=device, dtype=bf, generator=gen) * 0.02).requires_grad_(True)
    tgt = torch.randint(0, shape.vocab, (n_tok,), device=device, generator=gen)

    def head(chunk: int, save: bool, impl: str | None = None, addmm: str = "1") -> Callable[[], Any]:
        def fn() -> None:
            env = {
                "RELAX_HEAD_KERNEL": impl or os.environ.get("RELAX_HEAD_KERNEL", ""),
                "RELAX_HEAD_ADDMM": addmm,
            }
            with environ(env):
                lp, ent = kernels.token_log_probs_and_entropy(
                    hid, w, tgt, chunk_tokens=chunk, save_logits=save
                )
                (-lp.mean() - 1e-3 * ent.mean()).backward()

        return fn

    def reference() -> None:
        lp, ent = kernels.reference_log_probs_and_entropy(hid, w, tgt)
        (-lp.mean() - 1e-3 * ent.mean()).backward()

    def grads(fn: Callable[[], Any]) -> tuple[torch.Tensor, torch.Tensor]:
        hid.grad = w.grad = None
        fn()
        out = (hid.grad.float().clone(), w.grad.float().clone())
        hid.grad = w.grad = None
        return out

    def rel(a: tuple[torch.Tensor, ...], b_: tuple[torch.Tensor, ...]) -> float:
        return max(
            float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in zip(a, b_, strict=True)
        )

    with torch.no_grad():
        lp0, ent0 = kernels.reference_log_probs_and_entropy(hid, w, tgt)
        os.environ["RELAX_HEAD_KERNEL"] = "compile"
        lp_c, ent_c = kernels.token_log_probs_and_entropy(hid, w, tgt, chunk_tokens=cfg.chunk_tokens)
        os.environ.pop("RELAX_HEAD_KERNEL")
        lp1, ent1 = kernels.token_log_probs_and_entropy(hid, w, tgt, chunk_tokens=cfg.chunk_tokens)
    impl = kernels._head_impl(hid)
    g_ref = grads(reference)
    g_default = grads(head(cfg.chunk_tokens, False))
    g_compile = grads(head(cfg.chunk_tokens, False, "compile", "0"))
    notes = [
        f"default kernel {impl}: vs fp32 full logits: log-prob max abs {float((lp1 - lp0).abs().max()):.1e}, "
        f"entropy {float((ent1 - ent0).abs().max()):.1e}, grads max rel {rel(g_default, g_ref):.1e}",
        f"vs compile path: log-prob {float((lp1 - lp_c).abs().max()):.1e}, grads max rel {rel(g_default, g_compile):.1e}",
    ]
    if rel(g_default, g_compile) > 2e-2 or float((lp1 - lp_c).abs().max()) > 1e-2:
        os.environ["RELAX_HEAD_KERNEL"] = "compile"
        os.environ["RELAX_HEAD_ADDMM"] = "0"
        notes.append("MISMATCH: the rows below use RELAX_HEAD_KERNEL=compile, RELAX_HEAD_ADDMM=0")
    lp0 = ent0 = lp1 = ent1 = lp_c = ent_c = None  # noqa: F841 (free the memory)
    g_ref = g_default = g_compile = None
    what = f"loss head {n_tok} tok x {shape.vocab}"
    add(what, f"ours ({impl}), chunk 4096", head(4096, False), "; ".join(notes))
    add(what, f"ours ({impl}), chunk 8192", head(8192, False))
    add(what, f"ours ({impl}), chunk 4096, save_logits", head(4096, True))
    add(what, "ours (compile), chunk 4096", head(4096, False, "compile"))
    add(what, "ours (compile), chunk 4096, no fp32 addmm", head(4096, False, "compile", "0"))
    add(what, "ours (eager), chunk 4096", head(4096, False, "eager", "0"))
    add(what, "full fp32 logits (reference)", reference)

    x = torch.randn(b, s, h, device=device, dtype=bf, requires_grad=True)
    gx = torch.randn_like(x)
    torch_norm = torch.nn.RMSNorm(h, eps=1e-6, device=device, dtype=bf)
    our_norm = kernels.RMSNorm(hidden_size=h, eps=1e-6).to(device=device, dtype=bf)
    add(f"RMSNorm {b}x{s}x{h}", "torch.nn.RMSNorm", lambda: torch_norm(x).backward(gx))
    add(f"RMSNorm {b}x{s}x{h}", "kernels.RMSNorm (compiled)", lambda: our_norm(x).backward(gx))
    y = torch.randn(b, s, 2 * shape.ffn, device=device, dtype=bf, requires_grad=True)
    gy = torch.randn(b, s, shape.ffn, device=device, dtype=bf)
    add(f"SwiGLU {b}x{s}x{shape.ffn}", "eager", lambda: kernels._swiglu_math(y).backward(gy))
    add(f"SwiGLU {b}x{s}x{shape.ffn}", "kernels.swiglu (compiled)", lambda: kernels.swiglu(y).backward(gy))
    try:
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

        add(
            f"SwiGLU {b}x{s}x{shape.ffn}",
            "megatron bias_swiglu_impl",
            lambda: bias_swiglu_impl(y, None).backward(gy),
        )
    except ImportError:
        pass
    return lines


# --------------------------------------------------------------------------------------------- main


def _init_dist(tp: int) -> tuple[int, int, torch.device]:
    """One process (world 1, own loopback port) or torchrun's environment; then megatron's groups."""
    from runtime.train.megatron.parallel import (
        ParallelLayout,
        free_port,
        init_process_group,
        initialize_parallel,
    )

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:
        addr, port = "127.0.0.1", free_port()
    init_process_group(rank, world, addr, port, local_rank=local if torch.cuda.is_available() else None)
    layout = ParallelLayout(tp=tp, world_size=world)
    initialize_parallel(layout, seed=1234)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    return rank, world, device


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_train", description=__doc__.split("\n")[0])
    p.add_argument("--models", default="0.5b,1.5b", help="comma list of: " + ",".join(SHAPES))
    p.add_argument(
        "--rows",
        default="hf,ours,ours-save",
        help="comma list of: hf, ours, ours-eager (without torch.compile), ours-save (head keeps logits), "
        "backend (MegatronTrainBackend.train_step), backend-recompute / backend-save (RELAX_HEAD_SAVE_LOGITS=0/1)",
    )
    p.add_argument(
        "--tiny", action="store_true", help="tiny shape, micro-batch 2 x 32, 2 per step, 1+2 steps"
    )
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--chunk-tokens", type=int, default=4096)
    p.add_argument(
        "--save-logits", action="store_true", help="head keeps bf16 chunk logits instead of recomputing"
    )
    p.add_argument("--sdpa", default="auto", choices=["auto", "cudnn", "flash", "efficient"])
    p.add_argument(
        "--compile-backend", default=None, help="torch.compile backend (default: inductor on CUDA only)"
    )
    p.add_argument(
        "--megatron-fusions",
        default="auto",
        choices=["auto", "on", "off"],
        help="megatron's torch.compile'd SwiGLU and bias-dropout-add (auto: on CUDA only)",
    )
    p.add_argument(
        "--builder",
        default="auto",
        choices=["auto", "model", "direct"],
        help="ours: runtime.train.megatron.model (auto falls back to a GPTModel built here)",
    )
    p.add_argument("--tp", type=int, default=1)
    p.add_argument(
        "--dp", type=int, default=1, help="data-parallel ranks (under torchrun; tp x cp x dp = world)"
    )
    p.add_argument("--cp", type=int, default=1, help="backend rows: context-parallel ranks (under torchrun)")
    p.add_argument(
        "--qkv-format",
        default="thd",
        choices=["thd", "bshd"],
        help="backend rows: micro-batches as packed sequences (thd, Relax's default) or padded rows",
    )
    p.add_argument(
        "--micro", action="store_true", help="CUDA: the levers one at a time, a second table first"
    )
    p.add_argument(
        "--profile-dir", default=None, help="profile one extra step of each row, a table per row here"
    )
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = Cfg(
        micro_batch=args.micro_batch,
        seq=args.seq,
        accum=args.accum,
        warmup=args.warmup,
        steps=args.steps,
        chunk_tokens=args.chunk_tokens,
        save_logits=args.save_logits,
        sdpa=args.sdpa,
        compile_backend=args.compile_backend,
        fusions={"auto": None, "on": True, "off": False}[args.megatron_fusions],
        builder=args.builder,
        cp=args.cp,
        qkv_format=args.qkv_format,
    )
    models = args.models.split(",")
    if args.tiny:
        models = ["tiny"]
        cfg.micro_batch, cfg.seq, cfg.accum, cfg.warmup, cfg.steps = 2, 32, 2, 1, 2
        cfg.chunk_tokens, cfg.hf_chunk = 24, 24
    rank, world, device = _init_dist(args.tp)
    if args.tp * args.cp * args.dp != world:
        raise SystemExit(f"--tp {args.tp} x --cp {args.cp} x --dp {args.dp} != world size {world}")
    if args.cp > 1 and set(args.rows.split(",")) - set(BACKEND_ROWS):
        raise SystemExit("--cp is for the backend rows only (--rows backend)")

    def log(msg: str) -> None:
        if rank == 0 and not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if args.micro and rank == 0:
        lines = micro(SHAPES[models[0]], cfg, device)
        print("\n".join(lines), flush=True)
        if args.json:
            with open(os.path.splitext(args.json)[0] + ".micro.md", "w") as f:
                f.write("\n".join(lines) + "\n")
    rows_wanted = args.rows.split(",")
    if not args.rows:
        rows_wanted = []
    out: list[dict[str, Any]] = []
    failures: list[str] = []
    for key in models:
        shape = SHAPES[key]
        for which in rows_wanted:
            if which == "hf" and world > 1:
                log("  (plain HF row skipped: single-GPU only)")
                continue
            log(f"{shape.name}: {which}")
            try:
                if which == "hf":
                    c = Cfg(**asdict(cfg))
                    if args.profile_dir:
                        c.profile = os.path.join(args.profile_dir, f"profile_{key}_hf.txt")
                    res = run_hf(shape, c, device, log)
                    label = "plain HF + torch.compile + chunked loss"
                elif which in ("ours", "ours-eager", "ours-save"):
                    c = Cfg(
                        **{
                            **asdict(cfg),
                            "compile": which != "ours-eager",
                            "save_logits": cfg.save_logits or which == "ours-save",
                        }
                    )
                    if args.profile_dir and rank == 0:
                        c.profile = os.path.join(args.profile_dir, f"profile_{key}_{which}.txt")
                    res = run_ours(shape, c, args.tp, device, log)
                    label = (
                        "ours (megatron-core + our kernels)"
                        + {
                            "ours": "",
                            "ours-eager": ", no torch.compile",
                            "ours-save": ", head keeps bf16 logits",
                        }[which]
                    )
                    if res.get("builder") == "direct":
                        label += ", GPTModel built by the bench (not model.py)"
                    if world > 1:
                        label += f", tp={args.tp} dp={args.dp}"
                elif which in BACKEND_ROWS:
                    c = Cfg(**asdict(cfg))
                    if args.profile_dir and rank == 0:
                        c.profile = os.path.join(args.profile_dir, f"profile_{key}_{which}.txt")
                    forced = BACKEND_ROWS[which]
                    with environ({} if forced is None else {"RELAX_HEAD_SAVE_LOGITS": forced}):
                        res = run_backend(shape, c, args.tp, device, log)
                    label = "ours (megatron backend: MegatronTrainBackend.train_step, sft)" + (
                        ", head keeps bf16 logits" if res["head_keeps_logits"] else ", head recomputes logits"
                    )
                    label += f", {args.qkv_format}"
                    if world > 1:
                        label += f", tp={args.tp} cp={args.cp} dp={args.dp}"
                else:
                    raise SystemExit(f"unknown row {which!r}")
            except SystemExit:
                raise
            except Exception as exc:  # one broken row must not cost the others (one GPU call runs them all)
                import traceback

                log(traceback.format_exc())
                failures.append(f"{shape.name} {which}: {type(exc).__name__}: {str(exc)[:300]}")
                _reset_peak(device)
                continue
            _reset_peak(device)  # the row's model and optimizer are gone with run_*'s frame
            r = row(label, shape, cfg, res, gpus=world, dp=args.dp)
            out.append(r)
            log(table([r]))
            if args.json and rank == 0:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    if rank == 0:
        dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(
            f"device: {dev} x {world}; torch {torch.__version__}; micro-batch {cfg.micro_batch} x {cfg.seq}, "
            f"{cfg.accum} per step; {cfg.warmup} warm-up + {cfg.steps} timed steps"
        )
        print(table(out))
        for f in failures:
            print(f"FAILED: {f}")
    from runtime.train.megatron.parallel import destroy_parallel

    destroy_parallel()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
