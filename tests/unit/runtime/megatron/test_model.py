"""ModelArgs from config.json and flags, TransformerConfig, SDPA core attention, and HF-equal logits (TP=1)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from runtime.train.megatron.model import ModelArgs, model_args_for
from runtime.train.megatron.parallel import ParallelLayout

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def _config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


# -- ModelArgs ---------------------------------------------------------------------------------------------


def test_from_hf_config_qwen2(hf_folder):
    args = ModelArgs.from_hf_config(_config(hf_folder("qwen2")))
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size) == (2, 64, 128)
    assert (args.num_attention_heads, args.num_query_groups, args.kv_channels) == (4, 2, 16)
    assert args.add_qkv_bias and not args.qk_layernorm and args.tied
    assert args.normalization == "RMSNorm" and args.swiglu and args.position_embedding_type == "rope"
    assert args.norm_epsilon == 1e-6 and args.vocab_size == 200 and not args.is_moe


def test_from_hf_config_qwen3(hf_folder):
    args = ModelArgs.from_hf_config(_config(hf_folder("qwen3")))
    assert args.qk_layernorm and not args.add_qkv_bias and not args.tied
    assert args.kv_channels == 32  # head_dim, not hidden / heads
    assert args.rotary_base == 1e6


def test_from_hf_config_llama(hf_folder):
    args = ModelArgs.from_hf_config(_config(hf_folder("llama")))
    assert not args.qk_layernorm and not args.add_qkv_bias and args.rotary_base == 5e5
    assert args.model_type == "llama"


def test_from_hf_config_qwen3_moe(hf_folder):
    args = ModelArgs.from_hf_config(_config(hf_folder("qwen3_moe")))
    assert args.is_moe and args.num_experts == 4 and args.moe_router_topk == 2
    assert args.moe_ffn_hidden_size == 32 and args.moe_layer_freq == 1
    assert args.moe_router_pre_softmax is False  # norm_topk_prob: softmax over the top-k
    assert args.moe_aux_loss_coeff == 0.0 and args.qk_layernorm


def test_qwen3_moe_dense_layers_become_a_pattern():
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(
        num_hidden_layers=4, mlp_only_layers=[1], decoder_sparse_step=1, num_experts=4
    ).to_dict()
    assert ModelArgs.from_hf_config(config).moe_layer_pattern() == [1, 0, 1, 1]
    config = Qwen3MoeConfig(num_hidden_layers=4, decoder_sparse_step=2, num_experts=4).to_dict()
    assert ModelArgs.from_hf_config(config).moe_layer_pattern() == [0, 1, 0, 1]


def test_unsupported_model_type_names_it():
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        ModelArgs.from_hf_config({"model_type": "gpt2"})


def test_flags_fill_and_win(hf_folder):
    folder = hf_folder("qwen2")
    # flags at Megatron's defaults are unset: everything comes from config.json
    args = model_args_for({"num_query_groups": 1, "normalization": "LayerNorm", "swiglu": False}, folder)
    assert args == ModelArgs.from_hf_config(_config(folder))
    # a set flag that agrees with the config is fine; a Megatron-only knob is taken from the flags
    args = model_args_for({"num_layers": 2, "make_vocab_size_divisible_by": 64}, folder)
    assert args.num_layers == 2 and args.padded_vocab(2) == 256


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "qwen3_moe"])
def test_a_normalized_spec_leaves_the_architecture_to_config_json(family, hf_folder):
    """Every flag of a normalized spec sits at its default (lists for the per-loss MoE knobs, the derived
    --max-position-embeddings = --seq-length placeholder, alltoall dispatcher): none of that conflicts."""
    from jobspec import normalize

    folder = hf_folder(family)
    spec = {"rollout-batch-size": 4, "num-rollout": 1, "prompt-data": "/p.jsonl", "colocate": True}
    values = normalize(obj={**spec, "hf-checkpoint": str(folder)}).spec.to_dict()
    assert model_args_for(values, folder) == ModelArgs.from_hf_config(_config(folder))


def test_fallback_defaults_equal_jobspecs():
    """What model_args_for uses where jobspec does not import (no pydantic) is jobspec's field defaults."""
    from jobspec.spec import FIELDS
    from runtime.train.megatron.model import FALLBACK_DEFAULTS, _parse_moe_layer_freq, _scalar

    for dest, value in FALLBACK_DEFAULTS.items():
        expected = _scalar(FIELDS[dest].default)
        if dest == "moe_layer_freq":
            expected = _parse_moe_layer_freq(expected)
        assert value == expected, dest
    assert FIELDS["add_bias_linear"].flag == "disable-bias-linear"


def test_derived_sequence_placeholder_is_not_a_conflict(hf_folder):
    # jobspec: on the megatron backend --max-position-embeddings = --seq-length (4096 unless given)
    args = model_args_for({"seq_length": 4096, "max_position_embeddings": 4096}, hf_folder("qwen2"))
    assert args.max_position_embeddings == 64
    with pytest.raises(
        ValueError, match="--max-position-embeddings 4096 conflicts with max_position_embeddings 64"
    ):
        model_args_for({"seq_length": 2048, "max_position_embeddings": 4096}, hf_folder("qwen2"))


def test_flag_conflicting_with_config_names_both(hf_folder):
    with pytest.raises(ValueError, match=r"--num-layers 4 conflicts with num_hidden_layers 2"):
        model_args_for({"num_layers": 4}, hf_folder("qwen2"))
    with pytest.raises(ValueError, match=r"--num-query-groups 4 conflicts with num_key_value_heads 2"):
        model_args_for({"group_query_attention": True, "num_query_groups": 4}, hf_folder("qwen2"))


def test_flags_alone_must_describe_the_model():
    with pytest.raises(ValueError, match="--num-layers"):
        model_args_for({"hidden_size": 64})
    args = model_args_for(
        {
            "num_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "vocab_size": 100,
            "max_position_embeddings": 32,
            "normalization": "RMSNorm",
        }
    )
    assert args.ffn_hidden_size == 256 and args.kv_channels == 16 and args.num_query_groups == 4


def test_padded_vocab():
    args = ModelArgs(2, 64, 128, 4, 2, 16, vocab_size=200, max_position_embeddings=64)
    assert args.padded_vocab(1) == 256 and args.padded_vocab(2) == 256 and args.padded_vocab(4) == 512
    with pytest.raises(ValueError, match="--padded-vocab-size 300 is not divisible"):
        ModelArgs(2, 64, 128, 4, 2, 16, 200, 64, padded_vocab_size=300).padded_vocab(8)


def test_transformer_config_precision_recompute_and_fusions(megatron_world):
    from runtime.train.megatron.model import transformer_config

    args = ModelArgs(2, 64, 128, 4, 2, 16, vocab_size=200, max_position_embeddings=64)
    layout = ParallelLayout()
    config = transformer_config(args, layout, values={"bf16": True, "recompute_granularity": "full"})
    assert config.params_dtype is torch.bfloat16 and config.bf16
    assert config.recompute_method == "uniform" and config.recompute_num_layers == 1
    assert (
        not config.bias_dropout_fusion
        and not config.apply_rope_fusion
        and not config.gradient_accumulation_fusion
    )
    assert transformer_config(args, layout, values={}).params_dtype is torch.float32
    with pytest.raises(ValueError, match="mutually exclusive"):
        transformer_config(args, layout, values={"bf16": True, "fp16": True})
    # context parallelism is SDPAttention's (dense models; MoE is refused: test_parallel.py)
    assert transformer_config(args, ParallelLayout(cp=2, world_size=2), values={}).context_parallel_size == 2
    with pytest.raises(
        ValueError, match="--num-layers 2 is not a multiple of --pipeline-model-parallel-size 4"
    ):
        transformer_config(args, ParallelLayout(pp=4, world_size=4), values={})


# -- the model against Hugging Face -------------------------------------------------------------------------


def _megatron_from(folder, values=None):
    from runtime.train.megatron.convert import load_hf_checkpoint
    from runtime.train.megatron.model import build_model, transformer_config

    args = ModelArgs.from_hf_config(_config(folder))
    layout = ParallelLayout()
    config = transformer_config(args, layout, values={**NO_DROPOUT, **(values or {})})
    models = build_model(args, layout, config)
    load_hf_checkpoint(models, folder, args, layout)
    models[0].eval()
    return args, models[0]


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "qwen3_moe"])
def test_logits_equal_hugging_face(family, hf_folder, megatron_world):
    from transformers import AutoModelForCausalLM

    folder = hf_folder(family)
    args, model = _megatron_from(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab_size, (2, 24))
    positions = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        expected = hf(ids).logits
        logits = model(ids, positions, None)
    assert logits.shape == (2, 24, args.padded_vocab(1))
    torch.testing.assert_close(logits[..., : args.vocab_size], expected, atol=1e-5, rtol=0)
    assert torch.count_nonzero(logits[..., args.vocab_size :]) == 0  # padding rows are zero


def test_packed_sequences_equal_separate_forwards(hf_folder, megatron_world):
    """`thd` packing through the whole GPTModel: [1, total] tokens with cu_seqlens give each sequence's
    logits as if it ran alone (RoPE positions restart per sequence, attention stays inside it)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    args, model = _megatron_from(hf_folder("qwen3"))
    torch.manual_seed(2)
    lengths = [5, 11, 8]
    seqs = [torch.randint(0, args.vocab_size, (n,)) for n in lengths]
    cu = torch.tensor([0, 5, 16, 24], dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max(lengths),
        max_seqlen_kv=max(lengths),
    )
    packed_ids = torch.cat(seqs).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    with torch.no_grad():
        packed = model(packed_ids, positions, None, packed_seq_params=params)[0]
        alone = [model(s.unsqueeze(0), torch.arange(len(s)).unsqueeze(0), None)[0] for s in seqs]
    torch.testing.assert_close(packed, torch.cat(alone), atol=1e-5, rtol=0)


def test_sdpa_attention_masks_and_gqa(megatron_world):
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from runtime.train.megatron.attention import SDPAttention

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    attn = SDPAttention(config, 1, AttnMaskType.causal, "self")
    torch.manual_seed(3)
    s, b = 6, 2
    q, k, v = torch.randn(s, b, 4, 16), torch.randn(s, b, 2, 16), torch.randn(s, b, 2, 16)
    out = attn(q, k, v, None)
    # naive reference: repeat KV groups, causal softmax
    kr, vr = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, kr) / 4.0
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), vr).reshape(s, b, 64)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    # a padding mask (True = masked) on top of causal: masked keys get no weight
    mask = torch.zeros(b, 1, s, s, dtype=torch.bool)
    mask[1, :, :, 0] = True
    out_masked = attn(q, k, v, mask)
    torch.testing.assert_close(out_masked[:, 0], out[:, 0])
    assert not torch.allclose(out_masked[1:, 1], out[1:, 1])
    from megatron.core.packed_seq_params import PackedSeqParams

    cp_attn = SDPAttention(
        TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, context_parallel_size=2),
        1,
        AttnMaskType.causal,
        "self",
    )
    cu = torch.tensor([0, s], dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    # under CP=2 every packed sequence is a multiple of 2 x 2 tokens (each rank holds 2 of its 4 chunks)
    assert s % 4
    with pytest.raises(
        ValueError, match="packed sequences under context parallelism 2 must be multiples of 4"
    ):
        cp_attn(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=packed)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_segments_in_one_call_equal_one_call_per_segment(megatron_world, causal):
    """A pack's segments through one SDPA call as padded rows give each segment's own attention (values and
    gradients), with query and key lengths that differ (bottom-right causal), and untouched rows left 0."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from runtime.train.megatron import attention

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    mask_type = AttnMaskType.causal if causal else AttnMaskType.no_mask
    attn = attention.SDPAttention(config, 1, mask_type, "self")
    segments = [(0, 5, 0, 5), (5, 1, 5, 7), (7, 9, 12, 9), (18, 3, 21, 6)]  # row 6 and 16-17 are in none
    assert attention._padded_segments(tuple(segments), causal) is not None
    torch.manual_seed(4)
    t = 27
    q, k, v = (torch.randn(t, n, 16, requires_grad=True) for n in (4, 2, 2))
    batched = attn._attend_segments(q, k, v, segments, causal)
    weights = torch.randn_like(batched)
    grads = torch.autograd.grad((batched * weights).sum(), (q, k, v))
    for q0, nq, k0, nk in segments:  # each segment alone, through the bshd path with an explicit mask
        qs, ks, vs = (
            x.detach()[a : a + n].unsqueeze(1) for x, a, n in ((q, q0, nq), (k, k0, nk), (v, k0, nk))
        )
        allowed = torch.ones(nq, nk, dtype=torch.bool)
        if causal:
            allowed = allowed.tril(diagonal=nk - nq)
        alone = attention.SDPAttention(config, 1, AttnMaskType.no_mask, "self")(
            qs, ks, vs, ~allowed.view(1, 1, nq, nk)
        )
        torch.testing.assert_close(batched[q0 : q0 + nq], alone[:, 0], atol=1e-6, rtol=0)
    assert batched[6].abs().sum() == 0 and batched[16:18].abs().sum() == 0
    attention._padded_segments.cache_clear()
    budget = attention._PAD_BUDGET, attention._PAD_FLOOR
    try:
        attention._PAD_BUDGET = attention._PAD_FLOOR = 0  # padding costs too much: one call per segment
        assert attention._padded_segments(tuple(segments), causal) is None
        q2, k2, v2 = (x.detach().requires_grad_() for x in (q, k, v))
        looped = attn._attend_segments(q2, k2, v2, segments, causal)
    finally:
        attention._PAD_BUDGET, attention._PAD_FLOOR = budget
        attention._padded_segments.cache_clear()
    torch.testing.assert_close(looped, batched, atol=1e-6, rtol=0)
    looped_grads = torch.autograd.grad((looped * weights).sum(), (q2, k2, v2))
    for got, want in zip(looped_grads, grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "recompute",
    [{"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
     {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}],
    ids=["full", "selective-core-attn"],
)  # fmt: skip
def test_recompute_gives_the_same_gradients(recompute, hf_folder, megatron_world):
    """Activation recompute runs on CPU (the shims cover the RNG state it saves) and changes nothing."""

    def grads(values):
        _, model = _megatron_from(hf_folder("qwen2"), values)
        model.train()
        torch.manual_seed(4)
        ids = torch.randint(0, 200, (2, 16))
        model(ids, torch.arange(16).expand(2, 16), None).float().pow(2).mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, recomputed = grads({}), grads(recompute)
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=0, msg=name)


def test_precomputed_rope_gives_megatrons_logits_and_gradients(hf_folder, megatron_world):
    """`kernels.precompute_rope` (on CUDA by default; forced here): cos/sin taken once per forward and applied
    through megatron's fused-RoPE hook give megatron's own RoPE bit for bit, for padded (bshd) and packed (thd)
    batches, forward and backward."""
    from megatron.core.packed_seq_params import PackedSeqParams

    from runtime.train.megatron.kernels import precompute_rope

    folder = hf_folder("qwen3")
    _, reference = _megatron_from(folder)
    args, model = _megatron_from(folder)
    assert model.config is not reference.config
    torch.manual_seed(3)
    ids = torch.randint(0, args.vocab_size, (2, 24))
    positions = torch.arange(24).expand(2, 24)
    lengths = [5, 11, 8]
    cu = torch.tensor([0, 5, 16, 24], dtype=torch.int32)
    thd = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=11, max_seqlen_kv=11
    )
    packed_positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)

    def run(gpt):
        gpt.zero_grad(set_to_none=True)
        padded = gpt(ids, positions, None)
        packed = gpt(ids[:1], packed_positions, None, packed_seq_params=thd)
        (padded.square().mean() + packed.square().mean()).backward()
        grads = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
        return padded.detach(), packed.detach(), grads

    want = run(reference)
    assert precompute_rope([model]) == 0  # CPU: off unless forced
    assert precompute_rope([model], force=True) == 1
    assert model.config.apply_rope_fusion and precompute_rope([model], force=True) == 0  # once
    got = run(model)
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], atol=0, rtol=0, msg=name)


def test_no_rope_fusion_keeps_megatrons_own_rope(hf_folder, megatron_world):
    """`apply_rope_fusion` (Megatron's default; `--no-rope-fusion` turns it off): with it, RoPE goes through
    megatron's fused-RoPE hook, which `kernels.precompute_rope` fills (on CUDA, or forced as here); without it
    the model keeps megatron's own RoPE in every layer."""
    from runtime.train.megatron.kernels import precompute_rope

    folder = hf_folder("qwen3")
    _, fused = _megatron_from(folder)
    _, plain = _megatron_from(folder, {"apply_rope_fusion": False})
    assert precompute_rope([fused], force=True) == 1 and fused.config.apply_rope_fusion
    assert precompute_rope([plain], force=True) == 0 and not plain.config.apply_rope_fusion
