"""What makes the Megatron backend fast without TransformerEngine and correct on CPU (docs/adr/0006).

**The loss head.** `token_log_probs_and_entropy` turns the final hidden states and the (vocab-parallel) output
weight into each token's log-probability of its target and the entropy of its next-token distribution,
without ever holding the logits of all tokens: tokens are taken `chunk_tokens` at a time, each chunk's logits
are made by one matmul in the weight's dtype, reduced to four numbers per token in fp32 (max, sum of
exponentials, the exponential-weighted logit sum, the target's logit), and dropped. The backward pass makes
each chunk's logits again (or reuses them with `save_logits=True`) and turns them straight into the gradient
of the logits, so peak extra memory is about one chunk of logits (the eager CPU path adds fp32 temporaries of
the same shape; the CUDA kernels materialise none and write the gradient over the recomputed logits).

Tensor parallelism: with `tp_group`, each rank holds `V_shard = V_padded / tp` consecutive rows of the output
weight (rank r has ids `[r * V_shard, (r + 1) * V_shard)`, megatron's `VocabParallelEmbedding` split) and the
same full `hidden`; the softmax statistics are merged across the group (one MAX and one SUM all-reduce per
chunk), the target's logit comes from the rank that owns the id, and the gradient of `hidden` is summed over
the group in backward (the input of a column-parallel layer). Rows at or beyond `vocab_size` (megatron pads
the vocabulary to a multiple of `make_vocab_size_divisible_by * tp`) are never part of the softmax: their
logits are not even computed and their gradient is zero.

Math, per token, with z = logits / T over the real vocabulary:
    lse = log sum_v exp(z_v),  p = exp(z - lse),  log_prob = z_target - lse,
    entropy = lse - sum_v p_v z_v,
    d log_prob / dz = onehot(target) - p,   d entropy / dz = -p * (z - sum_v p_v z_v).

**Norm and activation paths.** `rms_norm` / `RMSNorm` (a drop-in for the layer-norm slot of megatron's local
layer spec) and `swiglu` run one fused kernel each on CUDA (torch's fused rms_norm; torch.compile for SwiGLU)
and the same math eagerly on CPU. On the H200 neither beats what the model already has (torch.nn.RMSNorm;
megatron's compiled SwiGLU, which `cuda_fusions` turns on), and inside compiled layers inductor fuses both
anyway. `compile_transformer_layers` compiles megatron's transformer layers in place (CUDA by default; any
backend on request, which is how CPU tests trace them): 41.6% -> 45.7% MFU at Qwen2-0.5B in one run
(docs/benchmarks.md).

The per-chunk math runs as two Triton kernels on CUDA (statistics in one pass over each row with an online
max; the gradient as one pointwise pass, in place over recomputed logits), else torch.compile'd, else eagerly
(CPU); `RELAX_HEAD_KERNEL=triton|compile|eager` forces one. On CUDA the output weight's gradient is one GEMM per
chunk accumulating into an fp32 buffer (`addmm` with `out_dtype`; `RELAX_HEAD_ADDMM=0` turns it off).

**MoE token permutation** (`--moe-permute-fusion`): TransformerEngine's fused permute / unpermute / chunk-sort
kernels, which megatron calls under that flag, as torch autograd functions of our own (one gather forward, one
index_add backward each, routing probabilities in the same call), installed in megatron's slots for them by
`install_moe_permute_fusion` when TE is absent. Unlike megatron's unfused path they never copy split sizes to
the host, so the all-to-all dispatcher moves its host synchronisation from before the sort of tokens by local
expert to after it (megatron's `cuda_sync_point` logic under the flag).

Everything here runs on CPU (eager) with the same math as on CUDA; `RELAX_KERNELS_COMPILE=0` turns every
torch.compile and Triton use off.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "RMSNorm",
    "compile_transformer_layers",
    "compiled_kernels_enabled",
    "cuda_fusions",
    "fuse_adam",
    "fused_adam_devices",
    "fused_permute",
    "fused_permute_with_probs",
    "fused_sort_chunks_by_index",
    "fused_sort_chunks_by_index_with_probs",
    "fused_unpermute",
    "install_moe_permute_fusion",
    "precompute_rope",
    "reference_log_probs_and_entropy",
    "rms_norm",
    "swiglu",
    "token_log_probs_and_entropy",
]


# --------------------------------------------------------------------------------------------- compile


def compiled_kernels_enabled(t: Tensor) -> bool:
    """Whether the torch.compile'd kernels are used for tensors like `t` (CUDA only, unless turned off)."""
    return t.is_cuda and os.environ.get("RELAX_KERNELS_COMPILE", "1") != "0" and hasattr(torch, "compile")


_compiled_cache: dict[str, Callable[..., Any]] = {}


def _maybe_compiled(name: str, fn: Callable[..., Any], t: Tensor) -> Callable[..., Any]:
    if not compiled_kernels_enabled(t):
        return fn
    compiled = _compiled_cache.get(name)
    if compiled is None:
        compiled = torch.compile(fn, dynamic=None)
        _compiled_cache[name] = compiled
    return compiled


# ------------------------------------------------------------------------------------------- loss head


def _chunk_stats(
    logits: Tensor, target_local: Tensor, inv_temp: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row softmax statistics of one chunk of (local) logits, all fp32 [rows]:
    m = max z, s = sum exp(z - m), q = sum exp(z - m) * (z - m), zt = z[target] (0 where the id is not here)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) * inv_temp
    m = z.amax(dim=-1)
    zc = z - m.unsqueeze(-1)
    e = torch.exp(zc)
    s = e.sum(dim=-1)
    q = (e * zc).sum(dim=-1)
    n = z.shape[-1]
    owned = (target_local >= 0) & (target_local < n)
    zt = torch.gather(z, 1, target_local.clamp(0, n - 1).unsqueeze(-1)).squeeze(-1)
    zt = torch.where(owned, zt, torch.zeros_like(zt))
    return m, s, q, zt


def _chunk_grad(
    logits: Tensor,
    target_local: Tensor,
    lse: Tensor,
    mean_z: Tensor,
    g_logp: Tensor,
    g_ent: Tensor,
    inv_temp: float,
) -> Tensor:
    """d loss / d logits for one chunk, in the logits' dtype (1/T included)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) * inv_temp
    p = torch.exp(z - lse.unsqueeze(-1))
    g = -p * (g_logp.unsqueeze(-1) + g_ent.unsqueeze(-1) * (z - mean_z.unsqueeze(-1)))
    cols = torch.arange(z.shape[-1], device=z.device)
    hit = cols.unsqueeze(0) == target_local.unsqueeze(-1)
    g = g + torch.where(hit, g_logp.unsqueeze(-1), torch.zeros_like(g))
    return (g * inv_temp).to(logits.dtype)


# Triton versions of `_chunk_stats` / `_chunk_grad` (CUDA): the statistics in one pass over each row with an
# online max (torch.compile's reduction reads the row twice: max, then the sums), the gradient as one
# pointwise pass. Built on first use; `RELAX_HEAD_KERNEL` picks triton | compile | eager (default: triton on
# CUDA when importable, else compile; eager on CPU). TRITON_INTERPRET=1 runs them on CPU (tests).

_triton_kernels: Any = None


def _build_triton_kernels() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def stats_kernel(
        z_ptr, stride, t_ptr, m_ptr, s_ptr, q_ptr, zt_ptr, inv_temp, n_cols: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        base = z_ptr + row * stride
        m = tl.full((), -1.0e30, tl.float32)
        s = tl.zeros((), tl.float32)
        q = tl.zeros((), tl.float32)
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < n_cols
            z = tl.load(base + cols, mask=ok, other=0.0).to(tl.float32) * inv_temp
            z = tl.where(ok, z, -1.0e30)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            scale = tl.exp(m - m_new)
            zc = tl.where(ok, z - m_new, 0.0)
            e = tl.where(ok, tl.exp(zc), 0.0)
            # q is sum e (z - m) about the running max: re-centre the old part on the new max
            q = scale * (q + (m - m_new) * s) + tl.sum(e * zc, axis=0)
            s = s * scale + tl.sum(e, axis=0)
            m = m_new
        t = tl.load(t_ptr + row)
        owned = (t >= 0) & (t < n_cols)
        zt = tl.load(base + tl.where(owned, t, 0)).to(tl.float32) * inv_temp
        tl.store(m_ptr + row, m)
        tl.store(s_ptr + row, s)
        tl.store(q_ptr + row, q)
        tl.store(zt_ptr + row, tl.where(owned, zt, 0.0))

    @triton.jit
    def grad_kernel(
        z_ptr,
        stride,
        out_ptr,
        out_stride,
        t_ptr,
        lse_ptr,
        mz_ptr,
        glp_ptr,
        gent_ptr,
        n_cols,
        inv_temp,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n_cols
        z = tl.load(z_ptr + row * stride + cols, mask=ok, other=0.0).to(tl.float32) * inv_temp
        lse = tl.load(lse_ptr + row)
        mz = tl.load(mz_ptr + row)
        glp = tl.load(glp_ptr + row)
        gent = tl.load(gent_ptr + row)
        t = tl.load(t_ptr + row)
        p = tl.exp(z - lse)
        g = -p * (glp + gent * (z - mz)) + tl.where(cols == t, glp, 0.0)
        tl.store(out_ptr + row * out_stride + cols, (g * inv_temp).to(out_ptr.dtype.element_ty), mask=ok)

    return stats_kernel, grad_kernel


def _triton_ready() -> bool:
    global _triton_kernels
    if _triton_kernels is None:
        try:
            _triton_kernels = _build_triton_kernels()
        except Exception:  # no triton here
            _triton_kernels = False
    return bool(_triton_kernels)


def _head_impl(t: Tensor) -> str:
    choice = os.environ.get("RELAX_HEAD_KERNEL", "")
    if choice in ("triton", "compile", "eager"):
        if choice == "triton" and not (
            _triton_ready() and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
        ):
            return "compile"  # asked for, but unusable here (or it failed earlier, which warned)
        return choice
    if not t.is_cuda:
        return "eager"
    if os.environ.get("RELAX_KERNELS_COMPILE", "1") == "0":
        return "eager"
    return "triton" if _triton_ready() else "compile"


_STATS_BLOCK = 4096
_GRAD_BLOCK = 2048


def _triton_stats(
    logits: Tensor, target_local: Tensor, inv_temp: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    stats_kernel, _ = _triton_kernels
    rows, n = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    acc = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(4, rows, dtype=acc, device=logits.device)
    t = target_local.contiguous()
    if rows:
        stats_kernel[(rows,)](
            logits,
            logits.stride(0),
            t,
            out[0],
            out[1],
            out[2],
            out[3],
            float(inv_temp),
            n_cols=n,
            BLOCK=min(_STATS_BLOCK, max(16, 1 << (n - 1).bit_length())),
            num_warps=8,
        )
    return out[0], out[1], out[2], out[3]


def _triton_grad(
    logits: Tensor,
    target_local: Tensor,
    lse: Tensor,
    mean_z: Tensor,
    g_logp: Tensor,
    g_ent: Tensor,
    inv_temp: float,
    *,
    in_place: bool = False,
) -> Tensor:
    _, grad_kernel = _triton_kernels
    rows, n = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
        in_place = True
    out = logits if in_place else torch.empty_like(logits)
    block = min(_GRAD_BLOCK, max(16, 1 << (n - 1).bit_length()))
    if rows:
        grad_kernel[(rows, triton_cdiv(n, block))](
            logits,
            logits.stride(0),
            out,
            out.stride(0),
            target_local.contiguous(),
            lse.contiguous(),
            mean_z.contiguous(),
            g_logp.contiguous(),
            g_ent.contiguous(),
            n,
            float(inv_temp),
            BLOCK=block,
            num_warps=8,
        )
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _with_fallback(
    fast: Callable[..., Any], math_fn: Callable[..., Any], t: Tensor, name: str
) -> Callable[..., Any]:
    """`fast` (a Triton launch); if it cannot be compiled or launched here, warn once, stop using Triton for
    the process and run the torch.compile'd (or eager) `math_fn` instead. A failed launch writes nothing."""

    def run(*args: Any, **kwargs: Any) -> Any:
        global _triton_kernels
        if _triton_kernels:
            try:
                return fast(*args, **kwargs)
            except Exception as exc:  # compilation or launch failure on this GPU / triton build
                warnings.warn(
                    f"kernels: Triton head kernel failed ({type(exc).__name__}: {exc}); "
                    "using the torch.compile path",
                    RuntimeWarning,
                    stacklevel=2,
                )
                _triton_kernels = False
        kwargs.pop("in_place", None)
        return _maybe_compiled(name, math_fn, t)(*args, **kwargs)

    return run


def _head_kernel(
    name: str, triton_fn: Callable[..., Any], math_fn: Callable[..., Any], t: Tensor
) -> Callable[..., Any]:
    """The loss head's `name` kernel for tensors like `t`, as `_head_impl` picks: `triton_fn` (with the
    torch path as its fallback, `_with_fallback`), the torch.compile'd `math_fn`, or `math_fn` (eager)."""
    impl = _head_impl(t)
    if impl == "triton":
        return _with_fallback(triton_fn, math_fn, t, name)
    if impl == "compile":
        return _maybe_compiled(name, math_fn, t)
    return math_fn


_addmm_fp32_out: bool | None = None  # whether addmm(bf16, bf16) -> fp32 in place works here (CUDA)


def _accumulate_wgrad(acc: Tensor, gz: Tensor, h: Tensor) -> None:
    """acc += gz.T @ h, with acc in fp32 and gz, h in bf16/fp16: on CUDA one GEMM that accumulates into the
    fp32 buffer (addmm with out_dtype); elsewhere a low-precision product added in."""
    global _addmm_fp32_out
    if acc.dtype == gz.dtype:
        acc.addmm_(gz.t(), h)
        return
    if gz.is_cuda and _addmm_fp32_out is not False and os.environ.get("RELAX_HEAD_ADDMM", "1") != "0":
        try:
            torch.addmm(acc, gz.t(), h, out_dtype=acc.dtype, out=acc)
            _addmm_fp32_out = True
            return
        except (TypeError, RuntimeError, NotImplementedError):
            _addmm_fp32_out = False
    acc.add_(gz.t() @ h)


class _VocabParallelLogProbs(torch.autograd.Function):
    """(hidden [N, h], weight [V_shard, h], targets [N]) -> (log_prob [N], entropy [N]), both fp32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        n_valid: int,
        vocab_start: int,
        inv_temp: float,
        group: Any,
        chunk: int,
        save_logits: bool,
    ) -> tuple[Tensor, Tensor]:
        n_tok = hidden.shape[0]
        w = weight[:n_valid]
        stats = _head_kernel("stats", _triton_stats, _chunk_stats, hidden)
        acc = torch.promote_types(weight.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        log_prob = torch.empty(n_tok, dtype=acc, device=hidden.device)
        entropy = torch.empty_like(log_prob)
        lse_all = torch.empty_like(log_prob)
        mean_z_all = torch.empty_like(log_prob)
        saved: list[Tensor] = []
        for a in range(0, n_tok, chunk):
            b = min(a + chunk, n_tok)
            t_local = targets[a:b] - vocab_start
            if n_valid > 0:
                logits = hidden[a:b] @ w.t()
                m, s, q, zt = stats(logits, t_local, inv_temp)
                if save_logits:
                    saved.append(logits)
                del logits
            else:  # a rank that holds only padding rows
                m = torch.full((b - a,), -math.inf, dtype=acc, device=hidden.device)
                s = torch.zeros_like(m)
                q = torch.zeros_like(m)
                zt = torch.zeros_like(m)
            if group is not None:
                big_m = m.clone()
                dist.all_reduce(big_m, op=dist.ReduceOp.MAX, group=group)
                here = s > 0  # this rank has a finite max for the row
                shift = torch.where(here, m - big_m, torch.zeros_like(m))
                scale = torch.where(here, torch.exp(shift), torch.zeros_like(m))
                # q is relative to this rank's max; re-centre on the group's: sum e (z - M) = q + (m - M) s
                packed = torch.stack([s * scale, (q + shift * s) * scale, zt])
                dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
                s, q, zt = packed[0], packed[1], packed[2]
                m = big_m
            log_s = torch.log(s)
            lse = m + log_s
            ez_rel = q / s  # E_p[z] - m
            log_prob[a:b] = zt - lse
            entropy[a:b] = log_s - ez_rel
            lse_all[a:b] = lse
            mean_z_all[a:b] = m + ez_rel
        ctx.save_for_backward(hidden, weight, targets, lse_all, mean_z_all, *saved)
        ctx.cfg = (n_valid, vocab_start, inv_temp, group, chunk, save_logits)
        return log_prob, entropy

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_ent: Tensor):  # type: ignore[override]
        hidden, weight, targets, lse_all, mean_z_all, *saved = ctx.saved_tensors
        n_valid, vocab_start, inv_temp, group, chunk, save_logits = ctx.cfg
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_tok = hidden.shape[0]
        g_logp = g_logp.to(lse_all.dtype) if g_logp is not None else torch.zeros_like(lse_all)
        g_ent = g_ent.to(lse_all.dtype) if g_ent is not None else torch.zeros_like(lse_all)
        grad_h = torch.zeros(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
        grad_w = None
        if need_w:
            # fp32 accumulation over chunks when the weight is in a low-precision dtype
            acc_dtype = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype
            grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device)
        if n_valid > 0 and (need_h or need_w):
            w = weight[:n_valid]
            # recomputed logits are this chunk's own: the Triton gradient overwrites them
            triton_grad = _triton_grad if save_logits else functools.partial(_triton_grad, in_place=True)
            grad_fn = _head_kernel("grad", triton_grad, _chunk_grad, hidden)
            for i, a in enumerate(range(0, n_tok, chunk)):
                b = min(a + chunk, n_tok)
                h = hidden[a:b]
                logits = saved[i] if save_logits else h @ w.t()
                gz = grad_fn(
                    logits,
                    targets[a:b] - vocab_start,
                    lse_all[a:b],
                    mean_z_all[a:b],
                    g_logp[a:b],
                    g_ent[a:b],
                    inv_temp,
                )
                del logits
                if need_h:
                    torch.mm(gz, w, out=grad_h[a:b])
                if need_w:
                    _accumulate_wgrad(grad_w[:n_valid], gz, h)
        if group is not None and need_h:
            dist.all_reduce(grad_h, op=dist.ReduceOp.SUM, group=group)
        if grad_w is not None and grad_w.dtype != weight.dtype:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None


def token_log_probs_and_entropy(
    hidden: Tensor,
    output_weight: Tensor,
    targets: Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    tp_group: Any = None,
    chunk_tokens: int = 4096,
    with_entropy: bool = True,
    save_logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probability of `targets` and entropy under softmax(hidden @ output_weight.T / temperature).

    hidden: [s, b, h] (megatron's layout) or [tokens, h], any float dtype; the full (not sequence-parallel)
        hidden states of this rank, identical on every rank of `tp_group`.
    output_weight: [V_shard, h], this rank's rows of the output layer (the whole weight without `tp_group`);
        with tied embeddings, the embedding weight (`GPTModel.shared_embedding_or_output_weight()`).
    targets: hidden.shape[:-1], global token ids in [0, vocab_size). A position whose id is out of range
        gets a meaningless log-prob (mask it in the loss; put any valid id there, e.g. 0).
    vocab_size: the real vocabulary; rows with global id >= vocab_size are padding and are left out of the
        softmax entirely. Default: all rows are real (V_shard * tp).
    temperature: logits are divided by it (the sampler's temperature, so log-probs match the sampler's).
    tp_group: the tensor-parallel group whose ranks each hold V_shard consecutive rows (rank order = id
        order). None: no tensor parallelism.
    chunk_tokens: tokens per chunk; peak extra memory is about chunk_tokens * V_shard * (2 bytes for bf16
        logits + 4 bytes per fp32 temporary on CPU / eager).
    with_entropy: also return the entropy (its gradient flows, for an entropy bonus). It costs nothing extra
        in the forward pass; without it the second output is None.
    save_logits: keep each chunk's logits (in the weight's dtype) for backward instead of recomputing them:
        one matmul less per chunk for chunk-count x chunk-size x V_shard x 2 bytes of memory.

    Returns (log_probs, entropy), fp32 (fp64 for fp64 inputs), shaped like `targets`. Gradients flow to `hidden` and `output_weight`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"targets {tuple(targets.shape)} must match hidden's leading dims {tuple(hidden.shape[:-1])}"
        )
    if output_weight.dim() != 2 or output_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"output_weight {tuple(output_weight.shape)} must be [V_shard, {hidden.shape[-1]}]")
    v_shard = output_weight.shape[0]
    rank, world = 0, 1
    if tp_group is not None:
        world = dist.get_world_size(tp_group)
        rank = dist.get_rank(tp_group)
        if world == 1:
            tp_group = None
    if vocab_size is None:
        vocab_size = v_shard * world
    if not 0 < vocab_size <= v_shard * world:
        raise ValueError(
            f"vocab_size {vocab_size} must be in (0, {v_shard * world}] (V_shard {v_shard} x tp {world})"
        )
    vocab_start = rank * v_shard
    n_valid = max(0, min(v_shard, vocab_size - vocab_start))
    h2 = hidden.reshape(-1, hidden.shape[-1])
    if output_weight.dtype != h2.dtype:
        h2 = h2.to(output_weight.dtype)
    t1 = targets.reshape(-1).long()
    log_prob, entropy = _VocabParallelLogProbs.apply(
        h2,
        output_weight,
        t1,
        n_valid,
        vocab_start,
        1.0 / float(temperature),
        tp_group,
        int(chunk_tokens),
        bool(save_logits),
    )
    log_prob = log_prob.view(targets.shape)
    return log_prob, (entropy.view(targets.shape) if with_entropy else None)


def reference_log_probs_and_entropy(
    hidden: Tensor,
    output_weight: Tensor,
    targets: Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """The same quantities from full fp32 logits with plain autograd (no TP): the tests' and bench's oracle."""
    w = output_weight if vocab_size is None else output_weight[:vocab_size]
    dt = torch.promote_types(output_weight.dtype, torch.float32)
    logits = (hidden.to(dt) @ w.to(dt).t()) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    log_prob = torch.gather(logp_all, -1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return log_prob, entropy


# ----------------------------------------------------------------------------------- norm, activation


def _rms_norm_math(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim, statistics in fp32, output in x's dtype. On CUDA with matching dtypes it is
    torch's fused `rms_norm` (measured 0.27 ms fwd+bwd against 0.72 ms for a torch.compile'd version at
    16 x 1024 x 896 bf16 on the H200, docs/benchmarks.md); a compiled kernel for mixed dtypes; eager on CPU."""
    if x.is_cuda and weight.dtype == x.dtype and hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return _maybe_compiled("rms_norm", _rms_norm_math, x)(x, weight, eps)


class RMSNorm(torch.nn.Module):
    """RMSNorm for the norm slots of megatron's local layer spec (`ModuleSpec(module=RMSNorm)` or the class
    itself): built as `RMSNorm(config=..., hidden_size=..., eps=...)`; the parameter is `weight`, as in
    `torch.nn.RMSNorm` (what megatron's `WrappedTorchNorm` builds), so checkpoints are interchangeable."""

    def __init__(self, config: Any = None, hidden_size: int = 0, eps: float = 1e-6, **_: Any) -> None:
        super().__init__()
        if config is not None and getattr(config, "sequence_parallel", False):
            raise ValueError(
                "kernels.RMSNorm does not mark its weight for sequence-parallel gradient reduction"
            )
        dtype = getattr(config, "params_dtype", None) or torch.float32
        device = None
        if (
            config is not None
            and not getattr(config, "use_cpu_initialization", True)
            and torch.cuda.is_available()
        ):
            device = torch.cuda.current_device()
        self.hidden_size = int(hidden_size)
        self.eps = float(eps)
        self.weight = torch.nn.Parameter(torch.ones(self.hidden_size, dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


def _swiglu_math(x: Tensor) -> Tensor:
    a, b = torch.chunk(x, 2, dim=-1)
    return F.silu(a) * b


def swiglu(x: Tensor) -> Tensor:
    """SiLU(first half) * second half of the last dim (megatron's gated-linear-unit order); fused on CUDA."""
    return _maybe_compiled("swiglu", _swiglu_math, x)(x)


def cuda_fusions(config: Any) -> Any:
    """`config` (a megatron `TransformerConfig`) with megatron's own fused SwiGLU and bias-dropout-add turned on
    when CUDA is available and compilation is allowed: megatron runs them through `torch.compile` (its
    `jit_fuser`), with no TransformerEngine or Apex. The SwiGLU fusion applies to a gated SiLU MLP only. Returns
    `config` unchanged otherwise (CPU keeps every fusion off)."""
    import dataclasses

    if (
        not dataclasses.is_dataclass(config)
        or not torch.cuda.is_available()
        or os.environ.get("RELAX_KERNELS_COMPILE", "1") == "0"
    ):
        return config
    changes: dict[str, Any] = {"bias_dropout_fusion": True}
    if getattr(config, "gated_linear_unit", False) and getattr(config, "activation_func", None) is F.silu:
        changes["bias_activation_fusion"] = True
    known = {f.name for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{k: v for k, v in changes.items() if k in known})


# ---------------------------------------------------------------------------------- layer compilation


_warn_substituted = False


def _quiet_warnings_in_graphs() -> None:
    """Inside compiled regions only, `warnings.warn` does nothing (dynamo's public polyfill registry; eager code
    still warns). megatron's linear layers issue a deprecation warning on every call (RowParallelLinear passes
    `tp_group=None`); dynamo cannot trace `warnings.warn`, so each call would break the graph, and the break
    inside megatron's activation-offloading context cannot be resumed: the rest of the layer would run eagerly."""
    global _warn_substituted
    if _warn_substituted or not hasattr(torch.compiler, "substitute_in_graph"):
        return
    try:

        @torch.compiler.substitute_in_graph(warnings.warn, skip_signature_check=True)
        def _no_warn(
            message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **_: Any
        ) -> None:
            return None
    except (TypeError, ValueError, RuntimeError):  # already registered, or not allowed in this torch
        pass
    _warn_substituted = True


def compile_transformer_layers(
    model: torch.nn.Module,
    *,
    backend: str | None = None,
    mode: str | None = None,
    dynamic: bool | None = None,
) -> int:
    """torch.compile every megatron `TransformerLayer` under `model` in place (`nn.Module.compile`, so parameter
    names and checkpoints are unchanged). Default: only when the model is on CUDA and compilation is not
    turned off (`RELAX_KERNELS_COMPILE=0`); naming a `backend` (e.g. "eager" on CPU) always compiles.
    Returns the number of layers compiled. Dynamo's cache limits are raised so that one compiled graph per
    layer never falls back to eager. `dynamic=None` (torch's automatic dynamic shapes): the first shape is
    compiled static (what the fixed-shape benchmarks measure), a second shape once more with the changed sizes
    symbolic, and no more after that; `False` would compile again for every micro-batch width or pack length
    an RL batch brings."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if not layers:
        return 0
    probe = next(model.parameters(), None)
    if backend is None:
        if probe is None or not compiled_kernels_enabled(probe):
            return 0
        backend = "inductor"
    import torch._dynamo

    cfg = torch._dynamo.config
    _quiet_warnings_in_graphs()
    cfg.cache_size_limit = max(getattr(cfg, "cache_size_limit", 8), 4 * len(layers))
    if hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 8 * len(layers))
    kwargs: dict[str, Any] = {"backend": backend, "dynamic": dynamic}
    if mode is not None:
        kwargs["mode"] = mode
    for layer in layers:
        layer.compile(**kwargs)
    return len(layers)


# ------------------------------------------------------------------------------------- rotary embedding

ROPE_PRECOMPUTE_ENV = "RELAX_ROPE_PRECOMPUTE"  # 0: megatron's own RoPE (cos and sin taken in every layer)


def _rope_packed_bshd(t: Tensor, packed: Tensor, interleaved: bool = False) -> Tensor:
    """Megatron's unfused RoPE (`rope_utils._apply_rotary_pos_emb_bshd` with mscale 1) with cos and sin
    already taken: `packed` is [s, ..., 2 * rot] = cat(cos(freqs), sin(freqs)); the same values, since megatron
    also takes them in fp32 and casts them to t's dtype."""
    from megatron.core.models.common.embeddings.rope_utils import _rotate_half

    rot = packed.shape[-1] // 2
    cos, sin = packed[..., :rot].to(t.dtype), packed[..., rot:].to(t.dtype)
    t_rot, t_pass = t[..., :rot], t[..., rot:]
    out = t_rot * cos + _rotate_half(t_rot, interleaved) * sin
    return torch.cat((out, t_pass), dim=-1) if t_pass.shape[-1] else out


def _rope_packed_thd(
    t: Tensor,
    cu_seqlens: Tensor,
    packed: Tensor,
    cp_size: int = 1,
    cp_rank: int = 0,
    interleaved: bool = False,
) -> Tensor:
    """The packed-sequence (thd) form: `packed` holds one row per token of `t` (`[t, 1, 1, 2 * rot]`, each
    token's position within its sequence already looked up by `precompute_rope`'s rotary embedding from the
    model's `position_ids`), so nothing here depends on `cu_seqlens` or the context-parallel split: one
    pointwise pass, no host sync, nothing for a compiled layer to break on. The positions are what megatron's
    `_apply_rotary_pos_emb_thd` gives each token (0..len-1 per sequence; under CP this rank's chunks of it)."""
    if packed.size(0) != t.size(0):
        raise ValueError(
            f"precomputed RoPE for packed sequences: {packed.size(0)} rows for {t.size(0)} tokens (the model "
            "must be called with the pack's position_ids)"
        )
    return _rope_packed_bshd(t.unsqueeze(1), packed, interleaved).squeeze(1)


def precompute_rope(models: list[torch.nn.Module], *, force: bool = False) -> int:
    """RoPE's cos and sin taken once per forward instead of in every layer: each GPTModel's rotary embedding
    returns cat(cos(freqs), sin(freqs)) (cached per freqs tensor, which megatron caches per length), and its
    attention applies them through megatron's `apply_rope_fusion` hook, filled with `_rope_packed_*` (the hook
    is TransformerEngine's and empty without it). Inside a compiled layer inductor would otherwise inline
    cos/sin of the [s, 1, 1, d] frequencies into the pointwise RoPE kernel over every query and key element:
    4% of the H200's time per step at Qwen2-0.5B (docs/benchmarks.md). All models sharing a
    `TransformerConfig` must go through here together (the switch is the config's). CUDA with compilation on
    by default (`RELAX_ROPE_PRECOMPUTE=0` turns it off, `=1` on anywhere); `force`: anywhere (tests). For
    packed sequences (thd) the model's `position_ids` are each token's position within its sequence (the
    backend's packs, under CP this rank's share): the rotary embedding looks each token's row up once per
    forward, and the model must be called with them. Does nothing where
    TransformerEngine fills the hook, or for rope variants other than plain RoPE. Returns models changed."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    setting = os.environ.get(ROPE_PRECOMPUTE_ENV)
    if not force and setting != "1":
        probe = next((p for m in models for p in m.parameters()), None)
        if probe is None or not compiled_kernels_enabled(probe) or setting == "0":
            return 0
    for name, ours in (
        ("fused_apply_rotary_pos_emb", _rope_packed_bshd),
        ("fused_apply_rotary_pos_emb_thd", _rope_packed_thd),
    ):
        current = getattr(rope_utils, name, None)
        if current is None:
            setattr(rope_utils, name, ours)
        elif current is not ours:
            return 0  # TransformerEngine's fused RoPE is there: megatron uses it
    changed = 0
    for model in models:
        for gpt in model.modules():
            rotary = getattr(gpt, "rotary_pos_emb", None)
            config = getattr(gpt, "config", None)
            if (
                type(rotary) is not RotaryEmbedding
                or config is None
                or getattr(rotary, "_relax_packed", False)
            ):
                continue
            if getattr(config, "multi_latent_attention", False) or getattr(config, "mrope_section", None):
                continue
            if getattr(config, "_relax_rope_fusion", True) is False:
                continue  # --no-rope-fusion: megatron's own RoPE (model.transformer_config)
            if getattr(config, "apply_rope_fusion", False) and not getattr(
                config, "_relax_packed_rope", False
            ):
                continue  # fused RoPE asked for by the model's own config: leave it to megatron
            rotary.forward = _packed_forward(rotary.forward, rotary)
            gpt.forward = _with_positions(gpt.forward, rotary)
            rotary._relax_packed = True
            config.apply_rope_fusion = True
            config._relax_packed_rope = True
            changed += 1
    return changed


def _with_positions(forward: Callable[..., Tensor], rotary: torch.nn.Module) -> Callable[..., Tensor]:
    """GPTModel.forward, with its `position_ids` left on the rotary embedding for the call (packed sequences'
    per-token RoPE rows, `_packed_forward`)."""

    def call(input_ids: Any, position_ids: Any, *args: Any, **kwargs: Any) -> Tensor:
        rotary._relax_positions = position_ids
        try:
            return forward(input_ids, position_ids, *args, **kwargs)
        finally:
            rotary._relax_positions = None

    return call


def _packed_forward(forward: Callable[..., Tensor], rotary: torch.nn.Module) -> Callable[..., Tensor]:
    """The rotary embedding's forward returning cat(cos, sin) of its frequencies (cached per frequency
    tensor); for packed sequences (`packed_seq=True`) one row per token of the call's `position_ids`."""
    cache: dict[int, tuple[Tensor, Tensor]] = {}

    def packed(*args: Any, **kwargs: Any) -> Tensor:
        freqs = forward(*args, **kwargs)
        hit = cache.get(id(freqs))
        if hit is None or hit[0] is not freqs:
            if len(cache) >= 32:
                cache.clear()
            hit = (freqs, torch.cat([torch.cos(freqs), torch.sin(freqs)], dim=-1))
            cache[id(freqs)] = hit
        packed_seq = kwargs.get("packed_seq", args[2] if len(args) > 2 else False)
        if not packed_seq:
            return hit[1]
        positions = getattr(rotary, "_relax_positions", None)
        if positions is None:
            raise ValueError("precomputed RoPE for packed sequences needs the model's position_ids")
        return hit[1][positions.reshape(-1).to(hit[1].device)]  # [t, 1, 1, 2 * rot]

    return packed


# ---------------------------------------------------------------------------------------- optimizer


def fused_adam_devices() -> tuple[str, ...]:
    """Where `fuse_adam` switches torch's Adam to its fused kernel: CUDA (`RELAX_FUSED_ADAM` unset or `auto`),
    every device torch has the kernel for (`1`: the CPU too, which is how CPU tests run the path), or none
    (`0`)."""
    choice = os.environ.get("RELAX_FUSED_ADAM", "auto").strip().lower()
    if choice in ("0", "off", "false", "no"):
        return ()
    if choice in ("1", "on", "true", "yes", "all"):
        return ("cuda", "cpu")
    return ("cuda",)


def fuse_adam(optimizer: Any, devices: tuple[str, ...] | None = None) -> int:
    """Switch every torch Adam/AdamW inside a megatron optimizer (a distributed optimizer, or a chain of them)
    to torch's fused kernel: one launch per device and dtype for the whole update, instead of the multi-tensor
    path's dozen passes over the parameters, gradients and moments. Megatron-core takes torch's Adam only when
    neither TransformerEngine's nor Apex's FusedAdam is installed, which is the GPU host's case; the update is
    the same AdamW (`torch.optim.AdamW(fused=True)`), within rounding.

    Idempotent; call it again after loading a checkpoint: a checkpoint written by a run that was not fused
    brings `fused: False` back in its parameter groups, and its per-parameter `step` counts on the host,
    where the fused kernel wants them on the parameters' device. Groups that are capturable (CUDA graphs) or
    differentiable, and parameters on a device outside `devices` (default `fused_adam_devices()`), are left
    as they are. Returns how many torch optimizers are fused."""
    devices = fused_adam_devices() if devices is None else devices
    fused = 0
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        if not isinstance(torch_opt, torch.optim.Adam | torch.optim.AdamW):
            continue  # TE's or Apex's FusedAdam, the CPU-offload hybrid, SGD: not ours to change
        groups = torch_opt.param_groups
        params = [p for g in groups for p in g["params"]]
        if (
            not params
            or any(g.get("capturable") or g.get("differentiable") for g in groups)
            or any(p.device.type not in devices or not p.is_floating_point() for p in params)
        ):
            continue
        for group in groups:
            group["fused"], group["foreach"] = True, False
        for p in params:
            state = torch_opt.state.get(p)
            step = state.get("step") if state else None
            if isinstance(step, Tensor) and step.device != p.device:
                state["step"] = step.to(device=p.device, dtype=torch.float32)
        fused += 1
    return fused


# ---------------------------------------------------------------------------------- MoE token permutation
#
# `--moe-permute-fusion`: megatron's `moe_utils.permute` / `unpermute` / `sort_chunks_by_idxs` call
# TransformerEngine's fused permutation kernels (module-level names of `moe_utils`, bound only with TE). The
# functions below take TE's arguments and return what TE returns, as megatron's call sites (0.16 and 0.19,
# alltoall and allgather dispatchers) use them; `install_moe_permute_fusion` binds them there when TE is absent.
# Each is one autograd function: one gather (`index_select`) forward and one scatter-add (`index_add_`)
# backward, or the reverse for unpermute; routing probabilities are gathered / scattered with the same row
# indices in the same call, where TE handles them. Sums (of a token's top-k expert outputs in unpermute, of its
# copies' gradients in permute's backward) are taken in the tensors' own dtype, as megatron's unfused path
# takes them. The row map handed from permute to unpermute is ours: a [2, rows] long tensor of each permuted
# row's token and expert; megatron only passes it along.


def _routed_rows(routing_map: Tensor, num_out: int) -> tuple[Tensor, Tensor]:
    """(token, expert) of the first `num_out` set entries of `routing_map` [tokens, experts], expert-major
    (each expert's tokens in token order: megatron's permutation order). No host sync and no sort: with c the
    running count of set entries in expert-major order, the j-th set entry is where c first reaches j + 1 (a
    binary search per output row)."""
    tokens = routing_map.shape[0]
    counts = torch.cumsum(routing_map.t().reshape(-1), 0)  # int64
    wanted = torch.arange(1, num_out + 1, device=routing_map.device, dtype=counts.dtype)
    order = torch.searchsorted(counts, wanted).clamp_(max=max(counts.numel() - 1, 0))
    return order % tokens, order.div(tokens, rounding_mode="floor")


class _Permute(torch.autograd.Function):
    """tokens [T, H] (and probs [T, E]) -> their rows per routed (token, expert), expert-major."""

    @staticmethod
    def forward(ctx: Any, tokens: Tensor, routing_map: Tensor, num_out: int, probs: Tensor | None):  # type: ignore[override]
        token, expert = _routed_rows(routing_map, num_out)
        ctx.save_for_backward(token, expert)
        ctx.shape, ctx.experts = tokens.shape, routing_map.shape[1]
        rows = torch.stack([token, expert])
        ctx.mark_non_differentiable(rows)
        permuted_probs = None
        if probs is not None:
            ctx.probs_dtype = probs.dtype
            permuted_probs = probs.reshape(-1).index_select(0, token * ctx.experts + expert)
        return tokens.index_select(0, token), permuted_probs, rows

    @staticmethod
    def backward(ctx: Any, grad: Tensor, grad_probs: Tensor | None, _rows: Any):  # type: ignore[override]
        token, expert = ctx.saved_tensors
        grad_tokens = grad.new_zeros(ctx.shape).index_add_(0, token, grad)
        grad_all_probs = None
        if grad_probs is not None and ctx.needs_input_grad[3]:
            flat = grad_probs.new_zeros(ctx.shape[0] * ctx.experts)
            grad_all_probs = flat.index_add_(0, token * ctx.experts + expert, grad_probs)
            grad_all_probs = grad_all_probs.view(ctx.shape[0], ctx.experts)
        return grad_tokens, None, None, grad_all_probs


class _Unpermute(torch.autograd.Function):
    """Permuted rows [rows, H] -> tokens [T, H]: each token the sum of its rows (each times its merging
    probability, when given)."""

    @staticmethod
    def forward(
        ctx: Any, rows: Tensor, row_map: Tensor, shape: tuple[int, int], merging_probs: Tensor | None
    ):  # type: ignore[override]
        token, expert = row_map[0], row_map[1]
        ctx.shape, ctx.dtype = tuple(shape), rows.dtype
        weights = None
        source = rows
        if merging_probs is not None:
            ctx.experts = merging_probs.shape[1]
            weights = merging_probs.reshape(-1).index_select(0, token * ctx.experts + expert)
            source = rows * weights.unsqueeze(-1)  # promotes to the probabilities' dtype, as megatron's path
        ctx.save_for_backward(token, expert, weights, rows if merging_probs is not None else None)
        out = source.new_zeros(ctx.shape).index_add_(0, token, source)
        return out.to(rows.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor):  # type: ignore[override]
        token, expert, weights, rows = ctx.saved_tensors
        grad_rows = grad.index_select(0, token)
        grad_probs = None
        if weights is not None:
            if ctx.needs_input_grad[3]:
                per_row = (grad_rows.to(weights.dtype) * rows.to(weights.dtype)).sum(-1)
                flat = per_row.new_zeros(ctx.shape[0] * ctx.experts)
                grad_probs = flat.index_add_(0, token * ctx.experts + expert, per_row).view(
                    ctx.shape[0], ctx.experts
                )
            grad_rows = (grad_rows * weights.unsqueeze(-1)).to(ctx.dtype)
        return grad_rows, None, None, grad_probs


def _chunk_rows(split_sizes: Tensor, sorted_index: Tensor, rows: int, device: torch.device) -> Tensor:
    """Source row of each output row when chunk i of the output is input chunk `sorted_index[i]` (chunks of
    `split_sizes` rows); computed on `device` without a host sync (megatron keeps both on the GPU under fusion)."""
    sizes = split_sizes.to(device=device, dtype=torch.long)
    order = sorted_index.to(device=device, dtype=torch.long)
    starts = torch.cumsum(sizes, 0) - sizes
    out_sizes = sizes.index_select(0, order)
    out_starts = torch.cumsum(out_sizes, 0) - out_sizes
    chunk = torch.repeat_interleave(torch.arange(order.numel(), device=device), out_sizes, output_size=rows)
    offset = torch.arange(rows, device=device) - out_starts.index_select(0, chunk)
    return starts.index_select(0, order).index_select(0, chunk) + offset


class _SortChunks(torch.autograd.Function):
    """Rows [N, ...] (and probs [N]) reordered chunk-wise: output chunk i is input chunk `sorted_index[i]`."""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, split_sizes: Tensor, sorted_index: Tensor, probs: Tensor | None):  # type: ignore[override]
        index = _chunk_rows(split_sizes, sorted_index, rows.shape[0], rows.device)
        ctx.save_for_backward(index)
        ctx.shape = rows.shape
        ctx.probs_shape = None if probs is None else probs.shape
        sorted_probs = None if probs is None else probs.index_select(0, index)
        return rows.index_select(0, index), sorted_probs

    @staticmethod
    def backward(ctx: Any, grad: Tensor, grad_probs: Tensor | None):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        grad_rows = grad.new_zeros(ctx.shape).index_add_(0, index, grad)
        grad_all_probs = None
        if grad_probs is not None and ctx.needs_input_grad[3]:
            grad_all_probs = grad_probs.new_zeros(ctx.probs_shape).index_add_(0, index, grad_probs)
        return grad_rows, None, None, grad_all_probs


def _num_out(routing_map: Tensor, num_out_tokens: Any) -> int:
    if num_out_tokens is None or int(num_out_tokens) < 0:
        return int(routing_map.sum())
    return int(num_out_tokens)


def fused_permute(
    inp: Tensor,
    routing_map: Tensor,
    num_out_tokens: Any = -1,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> tuple[Tensor, Tensor]:
    """TransformerEngine's `moe_permute` (mask map): (tokens' rows per routed expert, expert-major; row map)."""
    if map_type != "mask":
        raise ValueError(f"fused_permute: map_type {map_type!r} (only megatron's routing mask is handled)")
    out, _, rows = _Permute.apply(inp, routing_map, _num_out(routing_map, num_out_tokens), None)
    return out, rows


def fused_permute_with_probs(
    inp: Tensor, probs: Tensor, routing_map: Tensor, num_out_tokens: Any = -1
) -> tuple[Tensor, Tensor, Tensor]:
    """TransformerEngine's `moe_permute_with_probs`: (permuted rows, each row's probability, row map)."""
    return _Permute.apply(inp, routing_map, _num_out(routing_map, num_out_tokens), probs)


def fused_unpermute(
    inp: Tensor,
    row_id_map: Tensor,
    merging_probs: Tensor | None = None,
    restore_shape: Any = None,
    map_type: str = "mask",
    probs: Tensor | None = None,
    pad_offsets: Tensor | None = None,
) -> Tensor:
    """TransformerEngine's `moe_unpermute`: the permuted rows summed back onto their tokens (`restore_shape`),
    each weighted by its `merging_probs` [tokens, experts] entry when given (`probs` is TE's old name)."""
    if map_type != "mask" or pad_offsets is not None:
        raise ValueError("fused_unpermute: only megatron's routing mask without padding is handled")
    if restore_shape is None:
        raise ValueError("fused_unpermute: restore_shape is required (megatron always passes it)")
    return _Unpermute.apply(
        inp, row_id_map, tuple(restore_shape), merging_probs if merging_probs is not None else probs
    )


def fused_sort_chunks_by_index(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor) -> Tensor:
    """TransformerEngine's `moe_sort_chunks_by_index`."""
    return _SortChunks.apply(inp, split_sizes, sorted_index, None)[0]


def fused_sort_chunks_by_index_with_probs(
    inp: Tensor, probs: Tensor, split_sizes: Tensor, sorted_index: Tensor
) -> tuple[Tensor, Tensor]:
    """TransformerEngine's `moe_sort_chunks_by_index_with_probs`."""
    return _SortChunks.apply(inp, split_sizes, sorted_index, probs)


PERMUTE_FUSION = {
    "fused_permute": fused_permute,
    "fused_permute_with_probs": fused_permute_with_probs,
    "fused_unpermute": fused_unpermute,
    "fused_sort_chunks_by_index": fused_sort_chunks_by_index,
    "fused_sort_chunks_by_index_with_probs": fused_sort_chunks_by_index_with_probs,
}
# the other TransformerEngine kernels `moe_utils` guards with `HAVE_TE`; 0.16 leaves them unbound without TE
_OTHER_TE_KERNELS = (
    "fused_moe_aux_loss",
    "fused_topk_with_score_function",
    "fused_compute_score_for_moe_aux_loss",
    "fused_permute_and_pad_with_probs",
)
# how `moe_utils` may read HAVE_TE for the switch below to be safe: its binding (0.16), its import (0.19), the
# module-level choice of what to import (done by then), and `not HAVE_TE or <that kernel is None>` guards
_HAVE_TE_READS = (
    re.compile(r"^\s*HAVE_TE = (True|False)\s*$"),
    re.compile(r"^\s*from [\w.]+ import HAVE_TE\s*$"),
    re.compile(r"^if HAVE_TE:\s*$"),
    re.compile(r"^\s+if not HAVE_TE or\b"),
)


def install_moe_permute_fusion() -> bool:
    """Make megatron's `--moe-permute-fusion` path run our permutation functions when TransformerEngine is not
    installed: bind them as `moe_utils.fused_permute` & co. (the names `TransformerConfig.__post_init__` checks
    and `permute` / `unpermute` / `sort_chunks_by_idxs` call), and set `moe_utils.HAVE_TE`.

    That flag is the narrow part: megatron (0.16 and 0.19) tests `not HAVE_TE or fused_<kernel> is None` before
    each fused call, so binding the kernels alone still raises "Please install TE". Every read of `HAVE_TE` in
    `moe_utils` is checked to be such a per-kernel guard (or its binding / import-time use) before it is set,
    and the TE kernels we do not provide are bound to None (as 0.19 binds them), so their guards still refuse
    them. `TransformerConfig.__post_init__` needs no change: it refuses `moe_permute_fusion` only while those
    names are None, so this must run before the config is built (`model.transformer_config` does). Where TE
    provides the kernels, nothing is changed and megatron uses TE's. Process-wide and idempotent; returns
    whether our functions are the ones megatron calls."""
    from megatron.core.transformer.moe import moe_utils

    current = getattr(moe_utils, "fused_permute", None)
    if current is fused_permute:
        return True
    if current is not None:
        return False  # TransformerEngine's kernels
    reads = [line for line in inspect.getsource(moe_utils).splitlines() if re.search(r"\bHAVE_TE\b", line)]
    odd = [line.strip() for line in reads if not any(p.match(line) for p in _HAVE_TE_READS)]
    if odd:
        raise ValueError(
            "--moe-permute-fusion without TransformerEngine: the installed megatron-core reads "
            f"moe_utils.HAVE_TE for more than kernel guards ({odd[0]!r}); not supported"
        )
    for name in _OTHER_TE_KERNELS:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)
    for name, function in PERMUTE_FUSION.items():
        setattr(moe_utils, name, function)
    moe_utils.HAVE_TE = True
    return True
