"""Decode attention as Triton kernels (`decode_attention="triton"`): one program per (row, KV head).

Each program holds its row's G query heads of one KV head (G = heads / KV heads, padded to 16 rows for the
tensor cores) and walks the cache positions 0..lengths[b] in blocks with an online softmax (running max and
sum, rescaled per block), so nothing of size [B, H, window] is written: no score tensor, no mask tensor, no
merge of two softmax parts, and no window rounded up past the row's own length. With a shared prefix
(`prefix` > 0: GRPO's n samples of one prompt, copies of one prefill) positions below `prefix` are read from
the row's group's first slot, `src[b]`, and the rest from its own slot: rows of a group are neighbouring
programs, so the prefix they share is read from HBM about once and from L2 after. Positions at and past
`prefix` come from slot b itself. Without sharing, `prefix` is 0.

The row kernel's second version (`_row_kernel`, the default since it was timed on an H100: 41 against 59 us a
layer; `RELAX_FASTGEN_TRITON_FUSED=0` selects the first) also stores the step's new key and value into the cache
(the model then skips its own index_put per layer) and can hold several KV heads per program (`CONFIG["heads"]`).

Numerics: q.k in fp32 accumulation (the eager paths round the scores to the activation dtype first), the
softmax in fp32, the probabilities cast to the cache's dtype for p.v (as the eager paths), the output cast
to q's dtype. CUDA only (`available()`; on the CPU only under triton's interpreter, for tests).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

try:  # triton ships with torch's CUDA wheels; absent on CPU-only hosts
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

# launch parameters; RELAX_FASTGEN_TRITON_<NAME> overrides one: `block` cache positions per loop iteration,
# `chunk` prefix positions per prefix program, `warps` / `stages` triton's num_warps / num_stages for both
# kernels. On an H100 at the GRPO shape (docs/benchmarks.md) the step took 36 us (row kernel) + 12 us (prefix
# kernel) per layer with the first row kernel at 3 stages, and 8 warps were slower (3.36 vs 3.28 ms per decode
# step).
#
# `fused=1` (the default) selects the second row kernel, `_row_kernel`: it writes the step's new key and value
# into the cache itself (no separate index_put per layer) and attends to them from registers, finds a row's
# group slot itself (no arange / div / mul kernels per layer), and holds `heads` KV heads per program (their
# query heads as one block, each row of it zero outside its own head's columns, so one dot serves both).
# `bench/gpu_fastgen_kernels.py` on an H100 at the GRPO shape (2026-12-06): row + prefix kernels 58.6 us a layer
# with the first kernel (fused=0 heads=1 stages=3), 41.2 us with fused=1 heads=2 block=64 warps=4 stages=2, the
# defaults; the decode step 3.28 -> 2.93 ms (docs/benchmarks.md). `fused=0` is the first kernel
# (`_decode_attention_kernel`).
CONFIG = {
    name: int(os.environ.get(f"RELAX_FASTGEN_TRITON_{name.upper()}", default))
    for name, default in (
        ("block", 64), ("chunk", 128), ("warps", 4), ("stages", 2), ("fused", 1), ("heads", 2),
    )
}  # fmt: skip
MAX_GROUP_QUERIES = 128  # a group's query heads per prefix program (padded); larger groups read it per row


def available(device: torch.device) -> bool:
    """On CUDA with triton; on the CPU only under triton's interpreter (`TRITON_INTERPRET=1`, for tests)."""
    return triton is not None and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def supports(head_dim: int) -> bool:
    """The kernels hold a head as one power-of-two block of at least 16 (64 and 128 in Qwen2 / Llama)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


if triton is not None:

    @triton.jit
    def _attend_block(
        q, k_ptrs, v_ptrs, pos, visible, m, total, acc, scale,
    ):  # fmt: skip
        k = tl.load(k_ptrs, mask=visible[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # [G_PAD, BLOCK_N] fp32, log2 units (scale holds log2(e))
        s = tl.where(visible[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_ptrs, mask=visible[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, total * alpha + tl.sum(p, axis=1), acc

    @triton.jit
    def _prefix_kernel(
        Q, K, V, PartM, PartL, PartAcc,
        stride_qb, stride_qh, stride_qg,
        stride_ks, stride_kh, stride_kt,
        rows, kv_heads, group, prefix, scale,
        G: tl.constexpr, NG_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        """One (group of rows, KV head, prefix chunk): every query head of the group's rows as one block of
        queries against positions [chunk * CHUNK, min(prefix, (chunk + 1) * CHUNK)) of the group's first
        slot; the partial softmax state (max, sum, unnormalised output) goes to Part*[chunk, row, head]."""
        grp = tl.program_id(0).to(tl.int64)  # offsets past 2**31 elements in large caches
        h = tl.program_id(1)
        chunk = tl.program_id(2)
        r = tl.arange(0, NG_PAD)
        i = r // G  # the row within the group
        g = r % G
        live = r < group * G
        row = grp * group + i
        d = tl.arange(0, D)
        n = tl.arange(0, BLOCK)
        q_ptrs = Q + row[:, None] * stride_qb + h * stride_qh + g[:, None] * stride_qg + d[None, :]
        q = tl.load(q_ptrs, mask=live[:, None], other=0.0)
        m = tl.full([NG_PAD], float("-inf"), dtype=tl.float32)
        total = tl.zeros([NG_PAD], dtype=tl.float32)
        acc = tl.zeros([NG_PAD, D], dtype=tl.float32)
        base = grp * group * stride_ks + h * stride_kh
        first = chunk * CHUNK
        end = tl.minimum(first + CHUNK, prefix)
        for start in range(first, end, BLOCK):
            pos = start + n
            offs = base + pos[:, None] * stride_kt + d[None, :]
            m, total, acc = _attend_block(q, K + offs, V + offs, pos, pos < end, m, total, acc, scale)
        at = (chunk * rows + row) * kv_heads * G + h * G + g  # Part*[chunk, row, head, g]
        tl.store(PartM + at, m, mask=live)
        tl.store(PartL + at, total, mask=live)
        tl.store(PartAcc + at[:, None] * D + d[None, :], acc, mask=live[:, None])

    @triton.jit
    def _decode_attention_kernel(
        Q, K, V, Out, Lengths, Src, PartM, PartL, PartAcc,
        stride_qb, stride_qh, stride_qg,
        stride_ks, stride_kh, stride_kt,
        stride_ob, stride_oh, stride_og,
        rows, kv_heads, src_prefix, own_start, chunks, scale,
        G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """One (row, KV head): the prefix's partial states from `_prefix_kernel` merged (`chunks` of them),
        or positions below `src_prefix` read from slot Src[row]; then the row's own positions
        own_start..lengths[row]; the output normalised."""
        b = tl.program_id(0).to(tl.int64)  # offsets past 2**31 elements in large caches
        h = tl.program_id(1)
        length = tl.load(Lengths + b)  # positions 0..length are visible (the new token sits at `length`)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D)
        n = tl.arange(0, BLOCK)
        live = g < G
        q_ptrs = Q + b * stride_qb + h * stride_qh + g[:, None] * stride_qg + d[None, :]
        q = tl.load(q_ptrs, mask=live[:, None], other=0.0)
        m = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
        total = tl.zeros([G_PAD], dtype=tl.float32)
        acc = tl.zeros([G_PAD, D], dtype=tl.float32)
        for chunk in range(0, chunks):  # merge the shared prefix's partial states (padding rows: 0, 1, 0)
            at = (chunk * rows + b) * kv_heads * G + h * G + g
            m_c = tl.load(PartM + at, mask=live, other=0.0)
            l_c = tl.load(PartL + at, mask=live, other=1.0)
            acc_c = tl.load(PartAcc + at[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
            m_new = tl.maximum(m, m_c)
            alpha, beta = tl.exp2(m - m_new), tl.exp2(m_c - m_new)
            acc = acc * alpha[:, None] + acc_c * beta[:, None]
            total = total * alpha + l_c * beta
            m = m_new
        src = tl.load(Src + b)
        base = src * stride_ks + h * stride_kh
        for start in range(0, src_prefix, BLOCK):  # a shared prefix read per row, from the group's first slot
            pos = start + n
            offs = base + pos[:, None] * stride_kt + d[None, :]
            m, total, acc = _attend_block(q, K + offs, V + offs, pos, pos < src_prefix, m, total, acc, scale)
        base = b * stride_ks + h * stride_kh
        for start in range(own_start, length + 1, BLOCK):  # the row's own positions
            pos = start + n
            offs = base + pos[:, None] * stride_kt + d[None, :]
            m, total, acc = _attend_block(q, K + offs, V + offs, pos, pos <= length, m, total, acc, scale)
        out = acc / total[:, None]
        o_ptrs = Out + b * stride_ob + h * stride_oh + g[:, None] * stride_og + d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=live[:, None])

    @triton.jit
    def _attend_heads(
        q, k_ptrs, v_ptrs, loadable, visible, m, total, acc, scale,
    ):  # fmt: skip
        """`_attend_block` over a [BLOCK, HEADS * D] tile (`loadable` its load mask, `visible` [BLOCK])."""
        k = tl.load(k_ptrs, mask=loadable, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(visible[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_ptrs, mask=loadable, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, total * alpha + tl.sum(p, axis=1), acc

    @triton.jit
    def _row_kernel(
        Q, K, V, New, Out, Lengths, PartM, PartL, PartAcc,
        stride_qb, stride_qh, stride_qg,
        stride_ks, stride_kh, stride_kt,
        stride_nb, stride_nkv, stride_nh,
        stride_ob, stride_oh, stride_og,
        rows, kv_heads, group, src_prefix, own_start, chunks, scale,
        G: tl.constexpr, R_PAD: tl.constexpr, D: tl.constexpr, HEADS: tl.constexpr, BLOCK: tl.constexpr,
        WRITE: tl.constexpr,
    ):  # fmt: skip
        """One (row, HEADS KV heads): as `_decode_attention_kernel`, with the HEADS heads' query heads as
        the R_PAD rows of one block over HEADS * D columns (row r belongs to head r // G and is zero outside
        that head's D columns, so q.k^T gives each row its own head's scores, and p.v its output in its own
        head's columns). With WRITE the step's new key and value (New[row, 0 / 1, head], the token at
        position `length`) are stored into the cache here and attended to from registers; without it
        position `length` is read from the cache like the others."""
        b = tl.program_id(0).to(tl.int64)  # offsets past 2**31 elements in large caches
        h0 = tl.program_id(1) * HEADS
        length = tl.load(Lengths + b)  # positions 0..length are visible (the new token sits at `length`)
        r = tl.arange(0, R_PAD)
        rh = h0 + r // G  # the KV head of query row r
        g = r % G
        live = (r < HEADS * G) & (rh < kv_heads)
        c = tl.arange(0, HEADS * D)
        ch = h0 + c // D  # the KV head of column c
        d = c % D
        cols = ch < kv_heads
        own = live[:, None] & (rh[:, None] == ch[None, :])  # [R_PAD, HEADS * D]: a row's own head's columns
        q_ptrs = Q + b * stride_qb + ch[None, :] * stride_qh + g[:, None] * stride_qg + d[None, :]
        q = tl.load(q_ptrs, mask=own, other=0.0)
        m = tl.full([R_PAD], float("-inf"), dtype=tl.float32)
        total = tl.zeros([R_PAD], dtype=tl.float32)
        acc = tl.zeros([R_PAD, HEADS * D], dtype=tl.float32)
        for chunk in range(0, chunks):  # merge the shared prefix's partial states (padding rows: 0, 1, 0)
            at = (chunk * rows + b) * kv_heads * G + rh * G + g
            m_c = tl.load(PartM + at, mask=live, other=0.0)
            l_c = tl.load(PartL + at, mask=live, other=1.0)
            acc_c = tl.load(PartAcc + at[:, None] * D + d[None, :], mask=own, other=0.0)
            m_new = tl.maximum(m, m_c)
            alpha, beta = tl.exp2(m - m_new), tl.exp2(m_c - m_new)
            acc = acc * alpha[:, None] + acc_c * beta[:, None]
            total = total * alpha + l_c * beta
            m = m_new
        n = tl.arange(0, BLOCK)
        src = b // group * group  # the group's first slot (b itself without sharing: group 1)
        base = src * stride_ks + ch[None, :] * stride_kh + d[None, :]
        for start in range(0, src_prefix, BLOCK):  # a shared prefix read per row, from the group's first slot
            pos = start + n
            offs = base + pos[:, None] * stride_kt
            loadable = (pos[:, None] < src_prefix) & cols[None, :]
            m, total, acc = _attend_heads(
                q, K + offs, V + offs, loadable, pos < src_prefix, m, total, acc, scale
            )  # fmt: skip
        base = b * stride_ks + ch[None, :] * stride_kh + d[None, :]
        end = length + 1
        if WRITE:  # position `length` comes from registers below
            end = length
        for start in range(own_start, end, BLOCK):  # the row's own positions
            pos = start + n
            offs = base + pos[:, None] * stride_kt
            m, total, acc = _attend_heads(
                q, K + offs, V + offs, (pos[:, None] < end) & cols[None, :], pos < end, m, total, acc, scale
            )  # fmt: skip
        if WRITE:  # the new token: into the cache, and into the softmax from registers
            new = New + b * stride_nb + ch * stride_nh + d
            k_new = tl.load(new, mask=cols, other=0.0)
            v_new = tl.load(new + stride_nkv, mask=cols, other=0.0)
            at = b * stride_ks + ch * stride_kh + length * stride_kt + d
            tl.store(K + at, k_new, mask=cols)
            tl.store(V + at, v_new, mask=cols)
            s = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
            m_new = tl.maximum(m, s)
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new)
            p_v = p.to(v_new.dtype).to(tl.float32)[:, None] * v_new.to(tl.float32)[None, :]
            acc = acc * alpha[:, None] + p_v
            total = total * alpha + p
        out = acc / total[:, None]
        o_ptrs = Out + b * stride_ob + ch[None, :] * stride_oh + g[:, None] * stride_og + d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=own)


LOG2E = 1.4426950408889634


@functools.cache
def _g_pad(group: int) -> int:
    return max(16, 1 << (group - 1).bit_length())


def decode_attention(
    qg: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    *,
    scale: float,
    prefix: int = 0,
    group: int = 1,
    new: torch.Tensor | None = None,
) -> torch.Tensor:
    """qg [B, Hkv, G, D] (G query heads per KV head); keys/values: one layer's whole cache [S, Hkv, T, D]
    (each with unit stride over D, the same strides for both); lengths [B]: row b attends to positions
    0..lengths[b] (inclusive). With `prefix` > 0 rows come in groups of `group` consecutive slots and
    positions below `prefix` are read from each group's first slot. `new` [B, 2, Hkv, D] (only with
    `CONFIG["fused"]`): the step's keys and values, written here to position lengths[b] of
    slot b before that position is attended to. Returns [B, Hkv, G, D] in qg's dtype."""
    b, hkv, g, d = qg.shape
    if keys.stride() != values.stride() or keys.stride(-1) != 1 or qg.stride(-1) != 1:
        raise ValueError("decode_attention needs keys and values of one layout with unit stride over D")
    if not supports(d):
        raise ValueError(f"decode_attention needs a power-of-two head dim >= 16, not {d}")
    fused = bool(CONFIG["fused"])
    if new is not None and not fused:
        raise ValueError(
            "decode_attention takes `new` only with the fused kernel (RELAX_FASTGEN_TRITON_FUSED)"
        )
    if new is not None and new.stride(-1) != 1:
        new = new.contiguous()
    out = torch.empty_like(qg)
    scale2 = scale * LOG2E
    q_strides = (qg.stride(0), qg.stride(1), qg.stride(2))
    k_strides = (keys.stride(0), keys.stride(1), keys.stride(2))
    ng_pad = max(16, 1 << (group * g - 1).bit_length())
    block, chunk, launch = (
        CONFIG["block"],
        CONFIG["chunk"],
        {"num_warps": CONFIG["warps"], "num_stages": CONFIG["stages"]},
    )
    chunks = -(-prefix // chunk) if prefix > 0 and ng_pad <= MAX_GROUP_QUERIES else 0
    if chunks:  # the prefix once per group, in chunks side by side
        part_m = torch.empty((chunks, b, hkv, g), dtype=torch.float32, device=qg.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((chunks, b, hkv, g, d), dtype=torch.float32, device=qg.device)
        _prefix_kernel[(b // group, hkv, chunks)](
            qg, keys, values, part_m, part_l, part_acc, *q_strides, *k_strides,
            b, hkv, group, prefix, scale2,
            G=g, NG_PAD=ng_pad, D=d, BLOCK=block, CHUNK=chunk, **launch,
        )  # fmt: skip
    else:
        part_m = part_l = part_acc = out  # unread
    if fused:
        heads = max(1, min(CONFIG["heads"], hkv))
        heads = 1 << (heads.bit_length() - 1)  # a power of two (the columns are one block)
        new_arg = qg if new is None else new  # unread without WRITE
        new_strides = (0, 0, 0) if new is None else (new.stride(0), new.stride(1), new.stride(2))
        _row_kernel[(b, -(-hkv // heads))](
            qg, keys, values, new_arg, out, lengths, part_m, part_l, part_acc,
            *q_strides, *k_strides, *new_strides, out.stride(0), out.stride(1), out.stride(2),
            b, hkv, group if prefix else 1, 0 if chunks else prefix, prefix, chunks, scale2,
            G=g, R_PAD=max(16, 1 << (heads * g - 1).bit_length()), D=d, HEADS=heads, BLOCK=block,
            WRITE=new is not None, **launch,
        )  # fmt: skip
        return out
    rows = torch.arange(b, device=qg.device)
    src = rows if prefix == 0 else torch.div(rows, group, rounding_mode="floor") * group
    grid: Any = (b, hkv)
    _decode_attention_kernel[grid](
        qg, keys, values, out, lengths, src, part_m, part_l, part_acc, *q_strides, *k_strides,
        out.stride(0), out.stride(1), out.stride(2),
        b, hkv, 0 if chunks else prefix, prefix, chunks, scale2,
        G=g, G_PAD=_g_pad(g), D=d, BLOCK=block, **launch,
    )  # fmt: skip
    return out
