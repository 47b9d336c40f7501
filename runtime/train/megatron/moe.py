"""Routed experts computed with grouped GEMMs (`--moe-grouped-gemm`) without TransformerEngine (docs/adr/0006).

megatron-core's grouped experts are TransformerEngine's (`TEGroupedMLP`) or need the `grouped_gemm` package
(`GroupedMLP`); its local path, `SequentialMLP`, runs one matmul per expert and projection, i.e. 2 x local
experts small GEMMs (plus their backward) per MoE layer. `GroupedGemmMLP` is `SequentialMLP` with only the
forward replaced: the tokens as the dispatcher hands them (sorted by local expert, `tokens_per_expert` rows
each) go through one `torch._grouped_mm` per projection for all local experts, forward and backward.

Because it *is* a `SequentialMLP` (same `local_experts.{j}.linear_fc1/linear_fc2` parameters, names, init and
`sharded_state_dict`), Hugging Face conversion (convert.py) and torch_dist checkpoints are those of the
per-expert path, and a checkpoint written with the flag loads without it and vice versa.

What each expert computes is the per-expert `MLP`'s, row for row: fc1 (+ its bias), the activation (SwiGLU
as megatron's `gated_linear_unit` with SiLU, or the plain activation), times the token's routing
probability (where `MLP` applies `per_token_scale`: after the activation, cast back to the activation's
dtype), fc2, and fc2's bias times the probability. With `moe_apply_probs_on_input` the probabilities scale the
input instead, as `SequentialMLP` does. On CUDA with megatron's bias-activation fusion on, the weighted SwiGLU
is megatron's own fused kernel, as in `MLP`.

**Expert tensor parallelism.** Each local expert's `linear_fc1` / `linear_fc2` already holds this rank's
expert-tensor-parallel shard, and those layers communicate nothing: megatron builds expert linears with
`explicit_expert_comm` (tensor-parallel group > 1 or expert parallelism), under which `RowParallelLinear`
returns its partial sums unreduced and `ColumnParallelLinear` neither copies its input nor reduces its input
gradient; the token dispatcher reduce-scatters the experts' output over the expert-tensor group in its combine
step (and gathers their input in dispatch). With one rank in the group the linears' collectives are
identities. So the grouped path runs unchanged under ETP > 1: it computes exactly the shards the linears
would, and the dispatcher does the reduction as before.

**When the per-expert loop runs instead** (`SequentialMLP.forward`, per call):
- one local expert (nothing to group: `SequentialMLP` already makes one call per projection);
- no `torch._grouped_mm` in the installed torch;
- fp8 / fp4, TransformerEngine's activation module, gradient-accumulation fusion or deferred weight
  gradients (not used by this backend; megatron's own handling of them stays);
- megatron's bias-activation fusion with an activation other than SwiGLU;
- no tokens at all on this rank (nothing to compute; the loop handles the empty case);
- where `torch._grouped_mm` would refuse the operands: fp32, bf16 or fp16 only, and each row of every operand
  (input features K, output features N) a multiple of 16 bytes (K and N multiples of 8 in bf16/fp16, of 4 in
  fp32), on CPU and CUDA ("strides should be multiple of 16 bytes" otherwise); on CUDA a GPU of compute
  capability 9.0 or newer, where it was measured (H200, torch 2.11: bf16, fp16 and fp32 give the per-expert
  results, experts without tokens included; torch documents SM >= 80, older GPUs take the loop here).

Weights: each call stacks the local experts' fc1 (fc2) weights into one `[experts, N, K]` tensor for the grouped
call (the weights stay separate parameters; megatron's DDP lays them out in its buffer in reverse parameter
order, fc1 and fc2 interleaved, so no strided view of them exists). The stack is not kept for backward: the
backward pass stacks again for the input gradient, so the experts' weights are held once, as on the per-expert
path, and the extra memory is one transient copy of one projection's weights. Weight gradients come from one
grouped GEMM per projection over the token dimension (`[N, T] x [T, K]`, grouped by `tokens_per_expert`), so an
expert that receives no tokens gets a zero gradient, as on the per-expert path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP
from torch import Tensor

__all__ = ["GroupedGemmMLP", "grouped_mm_supported"]


def _grouped_mm_fn() -> Any:
    """torch's grouped GEMM (`torch.nn.functional.grouped_mm` where it exists, else `torch._grouped_mm`)."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm_supported(dtype: torch.dtype, device: torch.device, k: int, n: int) -> bool:
    """Whether `torch._grouped_mm` takes `[T, k] x [E, k, n]` operands of `dtype` on `device`, and their
    backward (`[T, n] x [E, n, k]`, `[n, T] x [T, k]`): fp32 / bf16 / fp16 rows of 16-byte multiples; on CUDA
    a GPU of compute capability 9.0 or newer (see the module docstring)."""
    if _grouped_mm_fn() is None or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    size = torch.empty((), dtype=dtype).element_size()
    if (k * size) % 16 or (n * size) % 16:
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 9
    return device.type == "cpu"


def _aligned(t: Tensor) -> Tensor:
    """`t` row-major, which with rows of 16-byte multiples (`grouped_mm_supported`) is what the grouped kernels
    read: a fresh tensor is aligned, and so is any row slice of one."""
    return t.contiguous()


class _GroupedLinear(torch.autograd.Function):
    """y[rows of group e] = x[rows of group e] @ weights[e].T for all groups in one grouped GEMM
    (`offs`: int32 end row of each group). Saves `x` and the weights themselves, not their stack."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, offs: Tensor, *weights: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, offs, *weights)
        stacked = torch.stack(weights)  # [E, N, K]
        return _grouped_mm_fn()(_aligned(x), stacked.transpose(1, 2), offs=offs)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, offs, *weights = ctx.saved_tensors
        dy = _aligned(dy)
        gmm = _grouped_mm_fn()
        dx = gmm(dy, torch.stack(weights), offs=offs) if ctx.needs_input_grad[0] else None
        dws: tuple[Tensor | None, ...] = (None,) * len(weights)
        if any(ctx.needs_input_grad[2:]):
            dw = gmm(dy.t(), _aligned(x), offs=offs)  # [E, N, K]; an empty group's block is zero
            dws = tuple(
                g if need else None for g, need in zip(dw.unbind(0), ctx.needs_input_grad[2:], strict=True)
            )
        return (dx, None, *dws)


class GroupedGemmMLP(SequentialMLP):
    """megatron's `SequentialMLP` (parameters, names, checkpoints) whose forward runs each projection of all
    local experts as one grouped GEMM; see the module docstring for what it computes and when it falls back
    to `SequentialMLP.forward`."""

    def forward(  # type: ignore[override]
        self, permuted_local_hidden_states: Tensor, tokens_per_expert: Tensor, permuted_probs: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        if not self._groupable(permuted_local_hidden_states):
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        x, probs = permuted_local_hidden_states, permuted_probs
        if self.config.moe_apply_probs_on_input:  # as SequentialMLP: scale the input, then probabilities of 1
            if self.config.moe_router_topk != 1:
                raise ValueError("moe_apply_probs_on_input needs --moe-router-topk 1")
            x = (probs.unsqueeze(-1) * x).to(x.dtype)
            probs = torch.ones_like(probs)
        counts = tokens_per_expert.to(device=x.device, dtype=torch.int64, non_blocking=True)
        offs = counts.cumsum(0).to(torch.int32)
        fc1 = [e.linear_fc1 for e in self.local_experts]
        fc2 = [e.linear_fc2 for e in self.local_experts]
        rows = None  # each row's local expert, for per-expert biases
        if fc1[0].bias is not None or fc2[0].bias is not None:
            experts = torch.arange(len(fc1), device=x.device)
            rows = torch.repeat_interleave(experts, counts, output_size=x.shape[0])
        h = _GroupedLinear.apply(x, offs, *(lin.weight for lin in fc1))
        bias1 = None if fc1[0].bias is None else torch.stack([lin.bias for lin in fc1])[rows]
        h = self._activation(h, bias1, probs)
        out = _GroupedLinear.apply(h, offs, *(lin.weight for lin in fc2))
        if fc2[0].bias is not None:  # MLP adds the expert's output bias scaled by the probability
            out += torch.stack([lin.bias for lin in fc2])[rows] * probs.unsqueeze(-1)
        return out, None

    def _activation(self, h: Tensor, bias: Tensor | None, probs: Tensor) -> Tensor:
        """The expert MLP's activation of fc1's output `h` (+ per-row `bias`), times each row's probability."""
        config = self.config
        if config.bias_activation_fusion:  # megatron's fused weighted SwiGLU, as MLP calls it (CUDA)
            from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl

            return weighted_bias_swiglu_impl(
                h, bias, probs.unsqueeze(-1), config.activation_func_fp8_input_store
            )
        if bias is not None:
            h = h + bias
        if config.gated_linear_unit:
            gate, linear = torch.chunk(h, 2, dim=-1)
            clamp = getattr(config, "activation_func_clamp_value", None)
            if clamp is not None:
                gate, linear = gate.clamp(max=clamp), linear.clamp(min=-clamp, max=clamp)
            h = config.activation_func(gate) * (linear + getattr(config, "glu_linear_offset", 0.0))
        else:
            h = config.activation_func(h)
        return (h * probs.unsqueeze(-1)).to(h.dtype)

    def _groupable(self, x: Tensor) -> bool:
        """Whether this call can take the grouped path (module docstring: when the loop runs instead)."""
        config = self.config
        if self.num_local_experts == 1 or x.shape[0] == 0 or _grouped_mm_fn() is None:
            return False
        if (
            getattr(config, "fp8", None)
            or getattr(config, "fp4", None)
            or getattr(config, "use_te_activation_func", False)
            or getattr(config, "gradient_accumulation_fusion", False)
            or getattr(config, "delay_wgrad_compute", False)
        ):
            return False
        if config.bias_activation_fusion and not (
            config.gated_linear_unit and config.activation_func is F.silu
        ):
            return False
        fc1, fc2 = self.local_experts[0].linear_fc1, self.local_experts[0].linear_fc2
        weight = fc1.weight
        if weight is None or fc2.weight is None or x.dtype != weight.dtype:
            return False
        k, n = weight.shape[1], weight.shape[0]
        return grouped_mm_supported(x.dtype, x.device, k, n) and grouped_mm_supported(
            x.dtype, x.device, fc2.weight.shape[1], fc2.weight.shape[0]
        )
