"""Hugging Face <-> Megatron weights (Qwen2/2.5, Qwen3, Llama, Qwen3-MoE): sharded on load, gathered on export.

Hugging Face names are the on-disk (safetensors) ones: `model.layers.{i}.self_attn.q_proj.weight`, per-expert
`model.layers.{i}.mlp.experts.{e}.gate_proj.weight`, `lm_head.weight` (absent when tied). Megatron names are
those of one `GPTModel` chunk's `state_dict()` (without `_extra_state`), layers numbered locally in the chunk.

How a tensor is laid out on a rank (tp = tensor-parallel size, r = its rank):
- `linear_qkv` (weight and bias): per query group g, [the group's query heads; k_g; v_g] (megatron's
  interleave), groups split contiguously: rank r holds groups [r * groups / tp, (r + 1) * groups / tp).
- `linear_fc1`: [gate; up] of the rank's shard, i.e. [gate rows of shard r; up rows of shard r].
- `linear_proj`, `linear_fc2`: input columns split by tp. Embedding and output layer: rows of the padded
  vocabulary split by tp; rows past the real vocabulary are zero.
- norms, q/k norms and the MoE router are replicated; experts are split over expert-parallel ranks
  (contiguous blocks of `num_experts / ep`) and each expert over expert-tensor-parallel ranks as above.
Raw mode (`--megatron-to-hf-mode raw`) is this mapping; `bridge` names the same mapping.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from runtime.train.megatron.model import ModelArgs
from runtime.train.megatron.parallel import ParallelLayout

MODES = ("raw", "bridge")  # --megatron-to-hf-mode; both name this module's mapping
ShardKey = tuple[int, int, int, int | None]  # (tp_rank, pp_rank, ep_rank, vp_stage)


# -- where things are ------------------------------------------------------------------------------------------


def chunk_layers(args: ModelArgs, layout: ParallelLayout, pp_rank: int, vp_stage: int | None = None) -> range:
    """Global indices of the layers of the model chunk (`pp_rank`, `vp_stage`). Chunks are laid out as
    megatron does with interleaving: chunk v of pipeline rank p holds block v * pp + p."""
    layout.check_layers(args.num_layers)
    per_chunk = args.num_layers // (layout.pp * layout.virtual_stages)
    block = (vp_stage or 0) * layout.pp + pp_rank
    return range(block * per_chunk, (block + 1) * per_chunk)


def is_first_chunk(layout: ParallelLayout, pp_rank: int, vp_stage: int | None) -> bool:
    return pp_rank == 0 and (vp_stage or 0) == 0


def is_last_chunk(layout: ParallelLayout, pp_rank: int, vp_stage: int | None) -> bool:
    return pp_rank == layout.pp - 1 and (vp_stage or 0) == layout.virtual_stages - 1


def has_output_weight(args: ModelArgs, layout: ParallelLayout, pp_rank: int, vp_stage: int | None) -> bool:
    """Whether the chunk owns `output_layer.weight`: the last chunk, unless tied and also the first
    (then the output layer reads the embedding)."""
    last = is_last_chunk(layout, pp_rank, vp_stage)
    return last and (not args.tied or not is_first_chunk(layout, pp_rank, vp_stage))


def _expert_tp_rank(layout: ParallelLayout, tp_rank: int, etp_rank: int | None) -> int:
    if etp_rank is not None:
        return etp_rank
    if layout.expert_tp == layout.tp:
        return tp_rank
    if layout.expert_tp == 1:
        return 0
    raise ValueError("give etp_rank when --expert-tensor-parallel-size differs from the tensor-parallel size")


# -- tensor layout helpers -------------------------------------------------------------------------------------


def _pad_rows(weight: Tensor, rows: int) -> Tensor:
    if weight.shape[0] > rows:
        raise ValueError(f"vocabulary of {weight.shape[0]} rows does not fit the padded size {rows}")
    if weight.shape[0] == rows:
        return weight
    return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])


def _shard(t: Tensor, parts: int, rank: int, dim: int = 0) -> Tensor:
    if t.shape[dim] % parts:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {parts} shards")
    return t.chunk(parts, dim=dim)[rank].contiguous()


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, args: ModelArgs) -> Tensor:
    """q `[heads * d, ...]`, k/v `[groups * d, ...]` -> megatron's group-interleaved `[(heads + 2 groups) * d,
    ...]` (weights and biases alike)."""
    groups, d = args.num_query_groups, args.kv_channels
    per_group = args.num_attention_heads // groups
    rest = q.shape[1:]
    qg = q.reshape(groups, per_group * d, *rest)
    kg = k.reshape(groups, d, *rest)
    vg = v.reshape(groups, d, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def _qkv_kinds(args: ModelArgs) -> tuple[str, ...]:
    """The tensors `linear_qkv` fuses: the weight, and the bias with `add_qkv_bias`."""
    return ("weight", "bias") if args.add_qkv_bias else ("weight",)


def _split_qkv(qkv: Tensor, args: ModelArgs) -> tuple[Tensor, Tensor, Tensor]:
    groups, d = args.num_query_groups, args.kv_channels
    per_group = args.num_attention_heads // groups
    rest = qkv.shape[1:]
    g = qkv.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = g.split([per_group * d, d, d], dim=1)
    return (
        q.reshape(-1, *rest).contiguous(),
        k.reshape(-1, *rest).contiguous(),
        v.reshape(-1, *rest).contiguous(),
    )


def _fc1_shard(gate: Tensor, up: Tensor, parts: int, rank: int) -> Tensor:
    return torch.cat([_shard(gate, parts, rank), _shard(up, parts, rank)])


def _fc1_unshard(shards: list[Tensor]) -> tuple[Tensor, Tensor]:
    halves = [s.chunk(2, dim=0) for s in shards]
    return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])


# -- Hugging Face -> one rank's chunk --------------------------------------------------------------------------


def hf_to_megatron(
    hf_state: Mapping[str, Tensor],
    args: ModelArgs,
    layout: ParallelLayout,
    *,
    tp_rank: int,
    pp_rank: int,
    ep_rank: int = 0,
    vp_stage: int | None = None,
    etp_rank: int | None = None,
) -> dict[str, Tensor]:
    """The state dict (without `_extra_state`) of the model chunk (`pp_rank`, `vp_stage`) on the rank with
    tensor-parallel rank `tp_rank` and expert-parallel rank `ep_rank` (expert-tensor rank `etp_rank`, by
    default the tensor-parallel rank). `hf_state` may be lazy: only the tensors the chunk needs are read."""
    tp = layout.tp
    out: dict[str, Tensor] = {}
    vocab_rows = args.padded_vocab(tp)
    first = is_first_chunk(layout, pp_rank, vp_stage)
    if first:
        embed = _pad_rows(hf_state["model.embed_tokens.weight"], vocab_rows)
        out["embedding.word_embeddings.weight"] = _shard(embed, tp, tp_rank)
    pattern = args.moe_layer_pattern()
    for local, layer in enumerate(chunk_layers(args, layout, pp_rank, vp_stage)):
        hf, mg = f"model.layers.{layer}.", f"decoder.layers.{local}."
        out[mg + "input_layernorm.weight"] = hf_state[hf + "input_layernorm.weight"]
        attn = hf + "self_attn."
        for kind in _qkv_kinds(args):
            qkv = _fuse_qkv(*(hf_state[f"{attn}{p}_proj.{kind}"] for p in "qkv"), args)
            out[f"{mg}self_attention.linear_qkv.{kind}"] = _shard(qkv, tp, tp_rank)
        if args.qk_layernorm:
            out[mg + "self_attention.q_layernorm.weight"] = hf_state[attn + "q_norm.weight"]
            out[mg + "self_attention.k_layernorm.weight"] = hf_state[attn + "k_norm.weight"]
        out[mg + "self_attention.linear_proj.weight"] = _shard(
            hf_state[attn + "o_proj.weight"], tp, tp_rank, dim=1
        )
        out[mg + "pre_mlp_layernorm.weight"] = hf_state[hf + "post_attention_layernorm.weight"]
        mlp = hf + "mlp."
        if pattern[layer]:
            out.update(
                _experts_to_megatron(
                    hf_state,
                    args,
                    layout,
                    mlp,
                    mg + "mlp.",
                    ep_rank,
                    _expert_tp_rank(layout, tp_rank, etp_rank),
                )
            )
        else:
            out[mg + "mlp.linear_fc1.weight"] = _fc1_shard(
                hf_state[mlp + "gate_proj.weight"], hf_state[mlp + "up_proj.weight"], tp, tp_rank
            )
            out[mg + "mlp.linear_fc2.weight"] = _shard(hf_state[mlp + "down_proj.weight"], tp, tp_rank, dim=1)
    if is_last_chunk(layout, pp_rank, vp_stage):
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        if has_output_weight(args, layout, pp_rank, vp_stage):
            name = "model.embed_tokens.weight" if args.tied else "lm_head.weight"
            out["output_layer.weight"] = _shard(_pad_rows(hf_state[name], vocab_rows), tp, tp_rank)
    return out


def _experts_to_megatron(
    hf_state: Mapping[str, Tensor],
    args: ModelArgs,
    layout: ParallelLayout,
    hf: str,
    mg: str,
    ep_rank: int,
    etp_rank: int,
) -> dict[str, Tensor]:
    assert args.num_experts is not None
    if args.num_experts % layout.ep:
        raise ValueError(
            f"--num-experts {args.num_experts} is not divisible by --expert-model-parallel-size {layout.ep}"
        )
    local = args.num_experts // layout.ep
    out = {mg + "router.weight": hf_state[hf + "gate.weight"]}
    etp = layout.expert_tp
    for j in range(local):
        e = hf + f"experts.{ep_rank * local + j}."
        key = mg + f"experts.local_experts.{j}."
        out[key + "linear_fc1.weight"] = _fc1_shard(
            hf_state[e + "gate_proj.weight"], hf_state[e + "up_proj.weight"], etp, etp_rank
        )
        out[key + "linear_fc2.weight"] = _shard(hf_state[e + "down_proj.weight"], etp, etp_rank, dim=1)
    return out


# -- every rank's chunks -> Hugging Face -----------------------------------------------------------------------


def megatron_to_hf(
    shards: Mapping[ShardKey, Mapping[str, Tensor]], args: ModelArgs, layout: ParallelLayout
) -> dict[str, Tensor]:
    """Hugging Face tensors from the chunk state dicts of every (tp_rank, pp_rank, ep_rank, vp_stage) (the
    inverse of `hf_to_megatron`; data-parallel replicas are not needed). Dense tensors are read from
    ep_rank 0; expert tensors from every ep_rank, keyed by their expert-tensor rank in the tp_rank slot.
    Vocabulary padding is dropped; `lm_head.weight` is absent when embeddings are tied."""
    out: dict[str, Tensor] = {}
    for pp_rank in range(layout.pp):
        for vp in [None] if layout.vpp is None else list(range(layout.vpp)):

            def part(tp_rank: int, ep_rank: int = 0, pp_rank=pp_rank, vp=vp) -> Mapping[str, Tensor]:
                key = (tp_rank, pp_rank, ep_rank, vp)
                if key not in shards:
                    raise KeyError(f"megatron_to_hf: no shard for (tp, pp, ep, vp) = {key}")
                return shards[key]

            out.update(chunk_to_hf(part, args, layout, pp_rank, vp))
    return out


def chunk_to_hf(
    part: Callable[..., Mapping[str, Tensor]],
    args: ModelArgs,
    layout: ParallelLayout,
    pp_rank: int,
    vp_stage: int | None = None,
    *,
    piece: str | int | None = None,
) -> dict[str, Tensor]:
    """Hugging Face tensors of one model chunk; `part(tp_rank, ep_rank=0)` gives that rank's chunk state
    (for expert tensors, the rank's expert-tensor rank stands in the tp_rank slot). `piece` limits it to
    the embedding ("embedding"), one local layer (its index) or the final norm and output ("final")."""
    tp, etp, vp = layout.tp, layout.expert_tp, vp_stage

    def cat(name: str, dim: int = 0) -> Tensor:
        return torch.cat([part(r)[name] for r in range(tp)], dim=dim)

    out: dict[str, Tensor] = {}
    pattern = args.moe_layer_pattern()
    first = part(0)
    if is_first_chunk(layout, pp_rank, vp) and piece in (None, "embedding"):
        out["model.embed_tokens.weight"] = cat("embedding.word_embeddings.weight")[: args.vocab_size]
    for local, layer in enumerate(chunk_layers(args, layout, pp_rank, vp)):
        if piece is not None and piece != local:
            continue
        hf, mg = f"model.layers.{layer}.", f"decoder.layers.{local}."
        out[hf + "input_layernorm.weight"] = first[mg + "input_layernorm.weight"]
        attn = hf + "self_attn."
        for kind in _qkv_kinds(args):
            q, k, v = _split_qkv(cat(f"{mg}self_attention.linear_qkv.{kind}"), args)
            out.update({f"{attn}q_proj.{kind}": q, f"{attn}k_proj.{kind}": k, f"{attn}v_proj.{kind}": v})
        if args.qk_layernorm:
            out[attn + "q_norm.weight"] = first[mg + "self_attention.q_layernorm.weight"]
            out[attn + "k_norm.weight"] = first[mg + "self_attention.k_layernorm.weight"]
        out[attn + "o_proj.weight"] = cat(mg + "self_attention.linear_proj.weight", dim=1)
        out[hf + "post_attention_layernorm.weight"] = first[mg + "pre_mlp_layernorm.weight"]
        mlp = hf + "mlp."
        if not pattern[layer]:
            gate, up = _fc1_unshard([part(r)[mg + "mlp.linear_fc1.weight"] for r in range(tp)])
            out[mlp + "gate_proj.weight"], out[mlp + "up_proj.weight"] = gate, up
            out[mlp + "down_proj.weight"] = cat(mg + "mlp.linear_fc2.weight", dim=1)
            continue
        assert args.num_experts is not None
        out[mlp + "gate.weight"] = first[mg + "mlp.router.weight"]
        local_n = args.num_experts // layout.ep
        for ep_rank in range(layout.ep):
            for j in range(local_n):
                key = mg + f"mlp.experts.local_experts.{j}."
                e = mlp + f"experts.{ep_rank * local_n + j}."
                gate, up = _fc1_unshard([part(r, ep_rank)[key + "linear_fc1.weight"] for r in range(etp)])
                down = torch.cat([part(r, ep_rank)[key + "linear_fc2.weight"] for r in range(etp)], dim=1)
                out.update(
                    {e + "gate_proj.weight": gate, e + "up_proj.weight": up, e + "down_proj.weight": down}
                )
    if is_last_chunk(layout, pp_rank, vp) and piece in (None, "final"):
        out["model.norm.weight"] = first["decoder.final_layernorm.weight"]
        if not args.tied:
            out["lm_head.weight"] = cat("output_layer.weight")[: args.vocab_size]
    return {name: t.contiguous() for name, t in out.items()}


# -- live models ---------------------------------------------------------------------------------------------


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The `GPTModel` inside megatron's DDP / Float16Module wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _ranks(layout: ParallelLayout) -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "ep_rank": ps.get_expert_model_parallel_rank(),
        "etp_rank": ps.get_expert_tensor_parallel_rank(),
    }


def _chunk_stages(layout: ParallelLayout, models: list) -> list[int | None]:
    if len(models) != layout.virtual_stages:
        raise ValueError(f"{len(models)} model chunks for {layout.virtual_stages} virtual stages")
    return [None] if layout.vpp is None else list(range(layout.vpp))


def model_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """A chunk's tensors by megatron name, without `_extra_state` entries."""
    return {
        k: v
        for k, v in unwrap(model).state_dict().items()
        if not k.endswith("_extra_state") and isinstance(v, Tensor)
    }


def load_hf_state(
    models: list, hf_state: Mapping[str, Tensor], args: ModelArgs, layout: ParallelLayout
) -> None:
    """Copy Hugging Face tensors into this rank's model chunks (megatron's parallel state gives the ranks)."""
    ranks = _ranks(layout)
    for model, vp in zip(models, _chunk_stages(layout, models), strict=True):
        state = hf_to_megatron(hf_state, args, layout, vp_stage=vp, **ranks)
        target = unwrap(model)
        expected = set(model_state(target))
        if set(state) != expected:
            raise ValueError(
                f"conversion and model disagree: missing {sorted(expected - set(state))[:5]}, "
                f"unexpected {sorted(set(state) - expected)[:5]}"
            )
        result = target.load_state_dict(state, strict=False)
        leftover = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if leftover or result.unexpected_keys:
            raise ValueError(
                f"load_state_dict: missing {leftover[:5]}, unexpected {result.unexpected_keys[:5]}"
            )


class SafetensorsFolder(Mapping[str, Tensor]):
    """A Hugging Face folder's tensors, read one at a time on access (`model.safetensors` or the sharded
    `model.safetensors.index.json` layout)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            self._files = {name: self.folder / file for name, file in weight_map.items()}
        else:
            from safetensors import safe_open

            single = self.folder / "model.safetensors"
            if not single.exists():
                raise FileNotFoundError(
                    f"{self.folder}: no model.safetensors or model.safetensors.index.json"
                )
            with safe_open(str(single), framework="pt") as f:
                self._files = {name: single for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict

    def __getitem__(self, name: str) -> Tensor:
        from safetensors import safe_open

        if name not in self._files:
            raise KeyError(f"{self.folder}: no tensor {name}")
        with safe_open(str(self._files[name]), framework="pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def load_hf_checkpoint(models: list, folder: str | Path, args: ModelArgs, layout: ParallelLayout) -> None:
    """Load `--hf-checkpoint` into this rank's chunks, reading only the tensors the rank holds."""
    load_hf_state(models, SafetensorsFolder(folder), args, layout)


def _all_gather(t: Tensor, group, size: int) -> list[Tensor]:
    import torch.distributed as dist

    if size == 1:
        return [t]
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t, group=group)
    return parts


def _replicated(name: str) -> bool:
    """Tensors every tensor-parallel rank holds whole (norms, the MoE router)."""
    return "layernorm" in name or name.endswith("router.weight")


def _piece_of(name: str) -> str | int:
    """Which piece of a chunk a megatron tensor belongs to (see `chunk_to_hf`)."""
    if name.startswith("decoder.layers."):
        return int(name.split(".", 3)[2])
    return "embedding" if name.startswith("embedding.") else "final"


def iter_stage_hf_state(
    models: list, args: ModelArgs, layout: ParallelLayout
) -> Iterator[tuple[str, Tensor]]:
    """(Hugging Face name, tensor) of this rank's pipeline stage, one piece (embedding, each layer, final
    norm and output) at a time, on the parameters' device: tensor-parallel shards are all-gathered in the
    tensor-parallel group, expert shards in the expert-tensor and expert-model-parallel groups, so only one
    layer is ever whole in memory. A collective over those groups: every rank of the stage iterates it to
    the end (each gets the same tensors). What a pipeline stage pushes to rollout engines."""
    from megatron.core import parallel_state as ps

    pp_rank = ps.get_pipeline_model_parallel_rank()
    tp_group, etp_group = ps.get_tensor_model_parallel_group(), ps.get_expert_tensor_parallel_group()
    ep_group = ps.get_expert_model_parallel_group()
    tp, etp, ep = layout.tp, layout.expert_tp, layout.ep
    for model, vp in zip(models, _chunk_stages(layout, models), strict=True):
        pieces: dict[str | int, dict[str, Tensor]] = {}
        for name, tensor in model_state(model).items():  # the same order on every rank
            pieces.setdefault(_piece_of(name), {})[name] = tensor.detach()
        for piece, tensors in pieces.items():
            dense: list[dict[str, Tensor]] = [{} for _ in range(tp)]
            experts: dict[tuple[int, int], dict[str, Tensor]] = {
                (r, e): {} for r in range(etp) for e in range(ep)
            }
            for name, tensor in tensors.items():
                if ".mlp.experts." in name:
                    for r, shard in enumerate(_all_gather(tensor, etp_group, etp)):
                        for e, gathered in enumerate(_all_gather(shard, ep_group, ep)):
                            experts[(r, e)][name] = gathered
                elif _replicated(name):
                    for part in dense:
                        part[name] = tensor
                else:
                    for r, shard in enumerate(_all_gather(tensor, tp_group, tp)):
                        dense[r][name] = shard

            def part(tp_rank: int, ep_rank: int = 0, dense=dense, experts=experts) -> Mapping[str, Tensor]:
                return {**(dense[tp_rank] if tp_rank < tp else {}), **experts.get((tp_rank, ep_rank), {})}

            yield from chunk_to_hf(part, args, layout, pp_rank, vp, piece=piece).items()


def stage_hf_state(models: list, args: ModelArgs, layout: ParallelLayout) -> dict[str, Tensor]:
    """`iter_stage_hf_state` as one dict: the whole pipeline stage (a collective, see there)."""
    return dict(iter_stage_hf_state(models, args, layout))


def gather_hf_state(
    models: list, args: ModelArgs, layout: ParallelLayout, *, dst: int | None = 0
) -> dict[str, Tensor] | None:
    """The whole model as Hugging Face tensors (CPU) on global rank `dst` (None: on every rank); other
    ranks get None. Each stage is assembled by `stage_hf_state`, then one rank per stage (tensor-parallel
    rank 0, context-parallel rank 0 of data-parallel replica 0) sends it. A collective: every rank must call
    it."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    stage = stage_hf_state(models, args, layout)
    leader = (
        ps.get_tensor_model_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
        and ps.get_data_parallel_rank() == 0
    )
    mine = {k: v.to("cpu", copy=True) for k, v in stage.items()} if leader else None
    if dst is None:
        everything: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everything, mine)
    else:
        everything = [None] * dist.get_world_size() if dist.get_rank() == dst else None
        dist.gather_object(mine, everything, dst=dst)
        if dist.get_rank() != dst:
            return None
    out: dict[str, Tensor] = {}
    for part in everything or []:
        out.update(part or {})
    return out


# -- Hugging Face folder -------------------------------------------------------------------------------------


def hf_config(args: ModelArgs, *, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A config.json for `args` (used when there is no source config to copy)."""
    if args.model_type is None:
        raise ValueError("hf_config: ModelArgs.model_type is unknown; pass the source config.json instead")
    architectures = {
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "llama": "LlamaForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
    }
    config: dict[str, Any] = {
        "architectures": [architectures[args.model_type]],
        "model_type": args.model_type,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.ffn_hidden_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_query_groups,
        "head_dim": args.kv_channels,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": args.norm_epsilon,
        "rope_theta": args.rotary_base,
        "tie_word_embeddings": args.tied,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if args.model_type != "qwen2":
        config["attention_bias"] = args.add_qkv_bias
    if args.use_rope_scaling:
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": args.rope_scaling_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    if args.is_moe:
        pattern = args.moe_layer_pattern()
        config.update(
            {
                "num_experts": args.num_experts,
                "num_experts_per_tok": args.moe_router_topk,
                "moe_intermediate_size": args.moe_ffn_hidden_size,
                "norm_topk_prob": not args.moe_router_pre_softmax,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [i for i, moe in enumerate(pattern) if not moe],
                "router_aux_loss_coef": args.moe_aux_loss_coeff,
            }
        )
    return config


def write_hf_folder(
    hf_state: Mapping[str, Tensor],
    folder: str | Path,
    args: ModelArgs,
    *,
    source: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write `model.safetensors` and `config.json` (the source checkpoint's, with its tokenizer and
    generation files, when `source` is given; else one made from `args`)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v if dtype is None else v.to(dtype)).contiguous() for k, v in hf_state.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if source is not None:
        for item in Path(source).iterdir():
            if (
                item.is_file()
                and not item.name.startswith("model")
                and not item.name.endswith((".safetensors", ".bin", ".pt"))
            ):
                shutil.copy2(item, folder / item.name)
    else:
        sample = next(iter(tensors.values()))
        (folder / "config.json").write_text(
            json.dumps(hf_config(args, dtype=sample.dtype), indent=2), encoding="utf-8"
        )
    return folder


def export_hf_folder(
    models: list,
    folder: str | Path,
    args: ModelArgs,
    layout: ParallelLayout,
    *,
    source: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Path | None:
    """Gather the model onto global rank 0 and write it there as a Hugging Face folder (see
    `write_hf_folder`). A collective; returns the folder on rank 0, None elsewhere."""
    state = gather_hf_state(models, args, layout, dst=0)
    if state is None:
        return None
    return write_hf_folder(state, folder, args, source=source, dtype=dtype)
