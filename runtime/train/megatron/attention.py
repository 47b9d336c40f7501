"""Core attention for megatron-core's layer spec over `torch.nn.functional.scaled_dot_product_attention`.

`SDPAttention` takes the place of megatron's `DotProductAttention` (the `core_attention` submodule of
`SelfAttention`; same constructor and forward signature in megatron-core 0.16 and 0.19) without
TransformerEngine: SDPA picks a flash / memory-efficient kernel on CUDA and the math kernel on CPU, and the
`[s, s]` score matrix of the unfused path never exists on the GPU.

Shapes (megatron's): `bshd` inputs arrive as query `[sq, b, heads/tp, d]`, key/value `[sk, b, groups/tp, d]`
and the output is `[sq, b, heads/tp * d]`. Packed sequences (`PackedSeqParams(qkv_format="thd", ...)`) arrive
as `[t, heads/tp, d]` with `cu_seqlens_q` / `cu_seqlens_kv` (int32, `[n + 1]`) giving sequence boundaries;
each sequence attends only to itself (causal within it) and the output is `[t, heads/tp * d]`. On CUDA in
fp16/bf16 (no dropout, no padded slots) one `torch.nn.attention.varlen.varlen_attn` call (flash, GQA-aware)
covers the whole pack; elsewhere each sequence gets its own SDPA call (measured on the H200, bf16, 14 heads /
2 groups of 64: 64 sequences of 64 tokens, forward + backward 21.4 ms per-sequence vs 0.7 ms varlen).

Context parallelism (`--context-parallel-size cp` > 1, `bshd` and `thd`): each rank holds 2 of every sequence's 2 cp
chunks (megatron's load-balanced layout, `parallel.cp_columns`: chunks r and 2 cp - 1 - r); keys and values
are all-gathered over the context-parallel group (their gradient reduce-scattered back, megatron's
`gather_from_sequence_parallel_region` on that group) and this rank's queries attend to them through a causal
mask built from the global positions of both. `bshd`: one SDPA call per layer with a `[2c, s]` boolean mask;
`thd` (megatron's layout: the whole pack's `cu_seqlens`, each sequence's two chunks end to end on each rank):
two segments per sequence, each chunk against its sequence's keys up to the chunk's end, causal from the bottom
right (torch's varlen flash kernel on CUDA). No ring exchange overlapped with compute as TransformerEngine's CP
attention does, and the full K/V of the micro-batch is held on every rank while the layer runs.

Attention masks follow megatron: a boolean `attention_mask` is True where attention is *forbidden*
(`[b or 1, 1, sq, sk]`); with the causal mask type the causal mask is applied on top of it.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

try:  # flash-attention over packed sequences (CUDA, fp16/bf16); torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _VARLEN_GQA_FLAG = "enable_gqa" in inspect.signature(_varlen_attn).parameters
except ImportError:  # pragma: no cover - older torch
    _varlen_attn, _VARLEN_GQA_FLAG = None, False


def _tp_size(pg_collection) -> int:
    if pg_collection is not None and getattr(pg_collection, "tp", None) is not None:
        return pg_collection.tp.size()
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


class _CPSegments(NamedTuple):
    """Rank `rank`'s attention segments of a pack under context parallelism (`_cp_segments`)."""

    segments: tuple[tuple[int, int, int, int], ...]  # (local query start, length, key start, key length)
    keys: Tensor  # each segment's key positions laid end to end (a sequence's prefix once per chunk), varlen
    cu_q: Tensor  # the segments' cumulative query lengths [2n + 1], varlen
    cu_k: Tensor  # ... and key lengths
    max_q: int
    max_k: int


@functools.lru_cache(maxsize=256)
def _cp_segments(seqlens: tuple[int, ...], cp: int, rank: int) -> _CPSegments:
    """Two segments per sequence of the pack: this rank's chunk r (its first local chunk) against the sequence's
    keys up to the chunk's end, and its chunk 2 cp - 1 - r likewise. The same for every layer of a micro-batch:
    cached (the tensors are on the host; callers must not modify them)."""
    segments, local, start = [], 0, 0
    for n in seqlens:
        c = n // (2 * cp)
        segments.append((local, c, start, (rank + 1) * c))
        segments.append((local + c, c, start, (2 * cp - rank) * c))
        local, start = local + 2 * c, start + n
    keys = torch.cat([torch.arange(k0, k0 + nk) for _, _, k0, nk in segments])
    lengths_q = torch.tensor([0] + [nq for _, nq, _, _ in segments])
    lengths_k = torch.tensor([0] + [nk for _, _, _, nk in segments])
    return _CPSegments(
        tuple(segments),
        keys,
        lengths_q.cumsum(0),
        lengths_k.cumsum(0),
        int(lengths_q.max()),
        int(lengths_k.max()),
    )


class _PaddedSegments(NamedTuple):
    """A pack's attention segments laid out as padded rows for one batched SDPA call (`_padded_segments`)."""

    q_index: Tensor  # [n, max_q]: the query row of each slot (padding slots repeat the segment's first row)
    k_index: Tensor  # [n, max_k]: likewise for keys
    allowed: Tensor  # [n, 1, max_q, max_k]: what each query slot may attend to
    q_valid: Tensor  # [n, max_q]: the slots that are real query rows
    q_rows: Tensor  # the real query rows, in the order of q_valid's True slots


# A pack is padded into rows only while that costs at most this many times the segments' own score entries
# (and always when that is under _PAD_FLOOR entries): a few long sequences among many short ones would
# otherwise pay for max_len² in every row.
_PAD_BUDGET, _PAD_FLOOR = 4, 1 << 16


@functools.lru_cache(maxsize=64)
def _padded_segments(segments: tuple[tuple[int, int, int, int], ...], causal: bool) -> _PaddedSegments | None:
    """The segments (query start, length, key start, length; none empty) as padded rows, or None when padding
    would cost too much (see _PAD_BUDGET). Causal segments see keys up to their diagonal at the bottom right;
    a padding query slot sees its segment's first key only (its output is dropped; a row with nothing allowed
    would make NaNs in the backward pass). The same for every layer of a micro-batch: cached (host tensors;
    callers must not modify them)."""
    n = len(segments)
    max_q = max(nq for _, nq, _, _ in segments)
    max_k = max(nk for _, _, _, nk in segments)
    dense = sum(nq * nk for _, nq, _, nk in segments)
    if n * max_q * max_k > max(_PAD_BUDGET * dense, _PAD_FLOOR):
        return None
    q0, nq, k0, nk = (torch.tensor(col).view(n, 1) for col in zip(*segments, strict=True))
    i, j = torch.arange(max_q).view(1, max_q), torch.arange(max_k).view(1, max_k)
    q_valid = i < nq
    k_valid = j < nk
    q_index = q0 + torch.where(q_valid, i, 0)
    k_index = k0 + torch.where(k_valid, j, 0)
    allowed = k_valid.unsqueeze(1).expand(n, max_q, max_k)
    if causal:  # key j of a segment is visible to query i when j <= i + (nk - nq)
        allowed = allowed & (j.view(1, 1, max_k) <= (i + nk - nq).view(n, max_q, 1))
    allowed = allowed | (~q_valid.unsqueeze(2) & (j.view(1, 1, max_k) == 0))
    return _PaddedSegments(q_index, k_index, allowed.unsqueeze(1).contiguous(), q_valid, q_index[q_valid])


class SDPAttention(MegatronModule):
    """Causal (or masked) attention of one layer, GQA-aware, tensor-parallel by heads (see module doc)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        if getattr(config, "window_size", None) is not None:
            raise ValueError("SDPAttention does not implement sliding-window attention (window_size)")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"SDPAttention implements the vanilla softmax only, not {config.softmax_type!r}")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        tp = _tp_size(pg_collection)
        self.num_heads = _divide(config.num_attention_heads, tp, "num_attention_heads")
        groups = config.num_query_groups or config.num_attention_heads
        self.num_groups = _divide(groups, tp, "num_query_groups")
        self.head_dim = config.kv_channels
        # apply_query_key_layer_scaling divides the scores by the layer number and the softmax multiplies
        # them back (an fp16 overflow guard); the product is 1, so only the plain scale matters here.
        self.softmax_scale = 1.0 / math.sqrt(self.head_dim) if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.cp_size = int(config.context_parallel_size)
        self._pg_collection = pg_collection

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """q `[b, h, sq, d]`, k/v `[b, g, sk, d]` -> `[b, h, sq, d]`."""
        if mask is not None and causal:
            sq, sk = q.shape[-2], k.shape[-2]
            # bottom-right aligned, as megatron's causal mask for sq < sk (decoding) is
            tri = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
            mask = mask & tri
            causal = False
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=self.num_heads != self.num_groups,
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        if attention_bias is not None:
            raise ValueError("SDPAttention does not take an attention bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = mask_type in (AttnMaskType.causal, getattr(AttnMaskType, "padding_causal", None))
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            if self.cp_size > 1:
                return self._forward_packed_context_parallel(query, key, value, packed_seq_params, causal)
            return self._forward_packed(query, key, value, packed_seq_params, causal)
        if self.cp_size > 1:
            return self._forward_context_parallel(query, key, value, attention_mask, causal)
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        allowed = None if attention_mask is None else ~attention_mask.to(torch.bool)
        if allowed is None and causal and q.shape[-2] != k.shape[-2]:
            allowed = torch.ones(1, 1, q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
        out = self._sdpa(q, k, v, allowed, causal)
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.num_heads * self.head_dim)

    def _cp_group(self):
        group = getattr(self._pg_collection, "cp", None) if self._pg_collection is not None else None
        if group is not None:
            return group
        from megatron.core import parallel_state

        return parallel_state.get_context_parallel_group()

    def _forward_context_parallel(
        self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, causal: bool
    ) -> Tensor:
        """Context parallelism (see module doc): this rank's queries `[2c, b, h, d]` (chunks r and 2 cp - 1 - r
        of the sequence's 2 cp chunks of c tokens) against every rank's keys and values, all-gathered over the
        context-parallel group (the gradient reduce-scattered back). The gathered keys stay in rank order; the
        mask is built from the global positions of both sides (attention does not depend on key order)."""
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        from runtime.train.megatron.parallel import cp_columns, cp_gathered_columns

        if attention_mask is not None:
            raise ValueError("SDPAttention takes no attention mask with context parallelism")
        group = self._cp_group()
        rank = group.rank()
        local = int(query.shape[0])
        width = local * self.cp_size
        key = gather_from_sequence_parallel_region(key, tensor_parallel_output_grad=True, group=group)
        value = gather_from_sequence_parallel_region(value, tensor_parallel_output_grad=True, group=group)
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        allowed = None
        if causal:
            q_pos = cp_columns(width, self.cp_size, rank).to(q.device)
            k_pos = cp_gathered_columns(width, self.cp_size).to(q.device)
            allowed = (k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)).view(1, 1, local, width)
        out = self._sdpa(q, k, v, allowed, False)
        b = query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(local, b, self.num_heads * self.head_dim)

    def _forward_packed_context_parallel(
        self, query: Tensor, key: Tensor, value: Tensor, params: PackedSeqParams, causal: bool
    ) -> Tensor:
        """Packed sequences under context parallelism: `cu_seqlens_q` are the whole pack's (each sequence a
        multiple of 2 cp tokens) and this rank holds chunks r and 2 cp - 1 - r of every sequence, end to end
        (`parallel.cp_packed_columns`; `[t / cp, h, d]`). Keys and values are all-gathered over the CP group
        and put back in sequence order; each chunk of queries then attends to its sequence's keys up to its own
        end, causally with the diagonal at the bottom right: 2 segments per sequence, through torch's varlen
        flash kernel on CUDA (bf16/fp16, no dropout) and one SDPA call per segment elsewhere."""
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        from runtime.train.megatron.parallel import cp_sequence_order

        if not causal:
            raise ValueError("SDPAttention's context parallelism is causal only")
        if params.cu_seqlens_q_padded is not None or params.cu_seqlens_kv_padded is not None:
            raise ValueError("SDPAttention takes no padded cu_seqlens with context parallelism")
        cp, group = self.cp_size, self._cp_group()
        rank = group.rank()
        cu = params.cu_seqlens_q
        seqlens = (cu[1:] - cu[:-1]).tolist()
        if any(n % (2 * cp) for n in seqlens):
            raise ValueError(f"packed sequences under context parallelism {cp} must be multiples of {2 * cp}")
        key = gather_from_sequence_parallel_region(key, tensor_parallel_output_grad=True, group=group)
        value = gather_from_sequence_parallel_region(value, tensor_parallel_output_grad=True, group=group)
        order = cp_sequence_order(tuple(seqlens), cp).to(key.device)
        key, value = key[order], value[order]  # [t, g, d], the pack in sequence order
        plan = _cp_segments(tuple(seqlens), cp, rank)
        if self._varlen_applies(query):
            keys, cu_q, cu_k = (t.to(query.device) for t in (plan.keys, plan.cu_q, plan.cu_k))
            return self._varlen(query, key[keys], value[keys], cu_q, cu_k, plan.max_q, plan.max_k, True)
        return self._attend_segments(query, key, value, list(plan.segments), True)

    def _forward_packed(
        self, query: Tensor, key: Tensor, value: Tensor, params: PackedSeqParams, causal: bool
    ):
        """`[t, h, d]` -> `[t, h * d]`: torch's flash varlen kernel on CUDA in fp16/bf16 (no padded slots, no
        dropout), else one SDPA call per sequence of the pack. Tokens that only pad a sequence to its
        `cu_seqlens_*_padded` slot are left at zero."""
        cu_q = params.cu_seqlens_q
        cu_kv = params.cu_seqlens_kv if params.cu_seqlens_kv is not None else cu_q
        if (
            self._varlen_applies(query)
            and params.cu_seqlens_q_padded is None
            and params.cu_seqlens_kv_padded is None
        ):
            max_q = params.max_seqlen_q or int((cu_q[1:] - cu_q[:-1]).max())
            max_kv = params.max_seqlen_kv or int((cu_kv[1:] - cu_kv[:-1]).max())
            return self._varlen(query, key, value, cu_q, cu_kv, max_q, max_kv, causal)
        start_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else cu_q
        start_kv = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else cu_kv
        len_q = (cu_q[1:] - cu_q[:-1]).tolist()
        len_kv = (cu_kv[1:] - cu_kv[:-1]).tolist()
        segments = list(zip(start_q[:-1].tolist(), len_q, start_kv[:-1].tolist(), len_kv, strict=True))
        return self._attend_segments(query, key, value, segments, causal)

    def _varlen_applies(self, query: Tensor) -> bool:
        """torch's varlen flash kernel runs this: CUDA, fp16/bf16, no attention dropout."""
        dropout = self.dropout_p if self.training else 0.0
        return (
            _varlen_attn is not None
            and query.is_cuda
            and query.dtype in (torch.float16, torch.bfloat16)
            and dropout == 0.0
        )

    def _attend_segments(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        segments: list[tuple[int, int, int, int]],
        causal: bool,
    ) -> Tensor:
        """`[t, h, d]` -> `[t, h * d]`: attention within each segment (query start, length, key start,
        length), causal with the diagonal at the bottom right when the lengths differ; query rows no segment
        covers stay 0. The segments go through one SDPA call as padded rows (`_padded_segments`) where that
        is cheap, else one call per segment."""
        out = query.new_zeros(query.shape[0], self.num_heads, self.head_dim)
        segments = [seg for seg in segments if seg[1] > 0]
        padded = _padded_segments(tuple(segments), causal) if len(segments) > 1 else None
        if padded is not None:
            device = query.device
            q_index, k_index = padded.q_index.to(device), padded.k_index.to(device)
            # [n, s, h, d] -> [n, h, s, d]
            q = query[q_index].transpose(1, 2)
            k = key[k_index].transpose(1, 2)
            v = value[k_index].transpose(1, 2)
            rows = self._sdpa(q, k, v, padded.allowed.to(device), False).transpose(1, 2)
            out[padded.q_rows.to(device)] = rows[padded.q_valid.to(device)]
            return out.reshape(query.shape[0], self.num_heads * self.head_dim)
        for q0, nq, k0, nk in segments:
            # [n, h, d] -> [1, h, n, d]
            q = query[q0 : q0 + nq].transpose(0, 1).unsqueeze(0)
            k = key[k0 : k0 + nk].transpose(0, 1).unsqueeze(0)
            v = value[k0 : k0 + nk].transpose(0, 1).unsqueeze(0)
            mask = None
            if causal and nq != nk:
                mask = torch.ones(1, 1, nq, nk, dtype=torch.bool, device=q.device)
            out[q0 : q0 + nq] = self._sdpa(q, k, v, mask, causal)[0].transpose(0, 1)
        return out.reshape(query.shape[0], self.num_heads * self.head_dim)

    def _varlen(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        cu_q: Tensor,
        cu_kv: Tensor,
        max_q: int,
        max_kv: int,
        causal: bool,
    ) -> Tensor:
        """torch's varlen flash kernel over the pack (`cu_*` its sequences' offsets); causal from the bottom
        right where a sequence's query and key lengths differ (flash's convention)."""
        extra = {"enable_gqa": True} if _VARLEN_GQA_FLAG and self.num_heads != self.num_groups else {}
        out = _varlen_attn(
            query,
            key,
            value,
            cu_q.to(torch.int32),
            cu_kv.to(torch.int32),
            int(max_q),
            int(max_kv),
            scale=self.softmax_scale,
            window_size=(-1, 0) if causal else (-1, -1),
            **extra,
        )
        return out.reshape(query.shape[0], self.num_heads * self.head_dim)
