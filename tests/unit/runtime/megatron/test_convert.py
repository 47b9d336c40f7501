"""Hugging Face <-> Megatron weights: layouts of the fused tensors, exact round trips over every layout,
gather from a live model, and an exported folder Hugging Face loads."""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings

import pytest
import torch

from runtime.train.megatron import convert
from runtime.train.megatron.model import ModelArgs
from runtime.train.megatron.parallel import ParallelLayout


def _args(folder) -> ModelArgs:
    return ModelArgs.from_hf_config(json.loads((folder / "config.json").read_text()))


def _all_shards(hf, args, layout):
    stages = [None] if layout.vpp is None else list(range(layout.vpp))
    return {
        (t, p, e, v): convert.hf_to_megatron(hf, args, layout, tp_rank=t, pp_rank=p, ep_rank=e, vp_stage=v)
        for t, p, e, v in itertools.product(range(layout.tp), range(layout.pp), range(layout.ep), stages)
    }


def _assert_same(a: dict, b: dict) -> None:
    assert set(a) == set(b), set(a) ^ set(b)
    for name in b:
        assert torch.equal(a[name], b[name]), name


def test_qkv_is_interleaved_per_group_and_split_by_groups():
    args = ModelArgs(
        1,
        8,
        16,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=2,
        vocab_size=10,
        max_position_embeddings=8,
    )
    q = torch.arange(8).float().repeat_interleave(1).unsqueeze(1)  # rows 0..7: heads 0-3, 2 rows each
    k = 100 + torch.arange(4).float().unsqueeze(1)
    v = 200 + torch.arange(4).float().unsqueeze(1)
    fused = convert._fuse_qkv(q, k, v, args).squeeze(1).tolist()
    # group 0: q heads 0,1 (rows 0-3), k_0 (100, 101), v_0 (200, 201); then group 1
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert all(
        torch.equal(x, y)
        for x, y in zip(convert._split_qkv(convert._fuse_qkv(q, k, v, args), args), (q, k, v), strict=True)
    )


def test_fc1_shards_hold_gate_then_up_of_their_slice(hf_folder):
    folder = hf_folder("llama")
    hf, args = convert.SafetensorsFolder(folder), _args(folder)
    layout = ParallelLayout(tp=2, world_size=2)
    shard1 = convert.hf_to_megatron(hf, args, layout, tp_rank=1, pp_rank=0)
    fc1 = shard1["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate[64:], up[64:]]))
    embed = shard1["embedding.word_embeddings.weight"]  # rows 128..255 of the padded 256
    assert embed.shape == (128, 64)
    assert torch.equal(embed[:72], hf["model.embed_tokens.weight"][128:]) and not embed[72:].any()


def test_chunks_follow_megatron_interleaving():
    args = ModelArgs(8, 8, 16, 2, 2, 4, vocab_size=10, max_position_embeddings=8)
    layout = ParallelLayout(pp=2, vpp=2, world_size=2)
    assert [list(convert.chunk_layers(args, layout, p, v)) for v in (0, 1) for p in (0, 1)] == [
        [0, 1], [2, 3], [4, 5], [6, 7],
    ]  # fmt: skip


LAYOUTS = {
    "tp2": ParallelLayout(tp=2, world_size=2),
    "pp2": ParallelLayout(pp=2, world_size=2),
    "tp2pp2": ParallelLayout(tp=2, pp=2, world_size=4),
    "pp2vpp2": ParallelLayout(pp=2, vpp=2, world_size=2),
}


@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_round_trip_is_exact_over_layouts(family, layout_name, hf_folder):
    overrides = {"num_hidden_layers": 4} if "vpp" in layout_name else {}
    folder = hf_folder(family, **overrides)
    hf, args, layout = dict(convert.SafetensorsFolder(folder)), _args(folder), LAYOUTS[layout_name]
    _assert_same(convert.megatron_to_hf(_all_shards(hf, args, layout), args, layout), hf)


@pytest.mark.parametrize(
    "layout",
    [
        ParallelLayout(ep=2, world_size=2),
        ParallelLayout(tp=2, ep=2, world_size=4),
        ParallelLayout(pp=2, ep=2, world_size=4),
        ParallelLayout(ep=4, world_size=4),
    ],
    ids=["ep2", "tp2ep2", "pp2ep2", "ep4"],
)
def test_moe_round_trip_and_expert_placement(layout, hf_folder):
    folder = hf_folder("qwen3_moe")
    hf, args = dict(convert.SafetensorsFolder(folder)), _args(folder)
    shards = _all_shards(hf, args, layout)
    _assert_same(convert.megatron_to_hf(shards, args, layout), hf)
    per_rank = args.num_experts // layout.ep
    last = shards[(0, 0, layout.ep - 1, None)]
    expert = f"model.layers.0.mlp.experts.{args.num_experts - 1}.down_proj.weight"
    local = f"decoder.layers.0.mlp.experts.local_experts.{per_rank - 1}.linear_fc2.weight"
    assert torch.equal(last[local], hf[expert].chunk(layout.tp, dim=1)[0])


@pytest.mark.parametrize("grouped", [False, True], ids=["per-expert", "moe-grouped-gemm"])
def test_gather_after_load_equals_the_folder(grouped, hf_folder, megatron_world):
    """HF -> Megatron -> HF is exact, also with --moe-grouped-gemm (GroupedGemmMLP keeps SequentialMLP's
    parameters and names)."""
    from runtime.train.megatron.model import build_model, transformer_config
    from runtime.train.megatron.moe import GroupedGemmMLP

    folder = hf_folder("qwen3_moe")
    args, layout = dataclasses.replace(_args(folder), moe_grouped_gemm=grouped), ParallelLayout()
    models = build_model(args, layout, transformer_config(args, layout, values={}))
    experts = [m for m in models[0].modules() if isinstance(m, GroupedGemmMLP)]
    assert len(experts) == (args.num_layers if grouped else 0)
    convert.load_hf_checkpoint(models, folder, args, layout)
    gathered = convert.gather_hf_state(models, args, layout, dst=None)
    _assert_same(gathered, dict(convert.SafetensorsFolder(folder)))


@pytest.mark.parametrize("with_source", [True, False], ids=["copied-config", "generated-config"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_exported_folder_loads_in_hugging_face(family, with_source, hf_folder, megatron_world, tmp_path):
    from transformers import AutoModelForCausalLM

    from runtime.train.megatron.model import build_model, transformer_config

    folder = hf_folder(family)
    args, layout = _args(folder), ParallelLayout()
    models = build_model(args, layout, transformer_config(args, layout, values={}))
    convert.load_hf_checkpoint(models, folder, args, layout)
    out = convert.export_hf_folder(
        models, tmp_path / "export", args, layout, source=folder if with_source else None
    )
    assert out is not None and (out / "config.json").exists()
    _assert_same(dict(convert.SafetensorsFolder(out)), dict(convert.SafetensorsFolder(folder)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original = AutoModelForCausalLM.from_pretrained(folder).eval()
        exported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, args.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, original(ids).logits, atol=0, rtol=0)
