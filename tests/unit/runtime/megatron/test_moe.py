"""`--moe-grouped-gemm` (moe.GroupedGemmMLP) and `--moe-permute-fusion` (kernels' permutation functions in
megatron's TransformerEngine slots) on CPU: the same logits and gradients as megatron's per-expert loop and
unfused permutation, for a tiny Qwen3-MoE (top-2 of 4 experts, an expert without tokens), both dispatchers."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

from runtime.train.megatron import kernels, moe
from runtime.train.megatron.model import ModelArgs, model_args_for
from runtime.train.megatron.parallel import ParallelLayout

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def _args(folder, **changes) -> ModelArgs:
    config = json.loads((folder / "config.json").read_text())
    return dataclasses.replace(ModelArgs.from_hf_config(config), **changes)


def _build(folder, *, grouped: bool, dispatcher: str, values: dict | None = None):
    from runtime.train.megatron.convert import load_hf_checkpoint
    from runtime.train.megatron.model import build_model, transformer_config

    args = _args(folder, moe_grouped_gemm=grouped, moe_token_dispatcher_type=dispatcher)
    layout = ParallelLayout()
    config = transformer_config(args, layout, values={**NO_DROPOUT, **(values or {})})
    models = build_model(args, layout, config)
    load_hf_checkpoint(models, folder, args, layout)
    return models[0]


@pytest.fixture
def spies(monkeypatch):
    """Records each experts call's token counts, grouped GEMM calls, and calls of our permutation functions
    through megatron's `moe_utils` slots."""
    from megatron.core.transformer.moe import moe_utils

    seen: dict[str, list] = {"counts": [], "grouped_mm": [], "permutation": []}

    def recording(forward):
        def experts(self, hidden, tokens_per_expert, probs):
            seen["counts"].append(tokens_per_expert.tolist())
            return forward(self, hidden, tokens_per_expert, probs)

        return experts

    gmm = moe._grouped_mm_fn()

    def counting_gmm(*args, **kwargs):
        seen["grouped_mm"].append(tuple(args[0].shape))
        return gmm(*args, **kwargs)

    # (a grouped call that fell back to the loop would be recorded twice)
    monkeypatch.setattr(moe.SequentialMLP, "forward", recording(moe.SequentialMLP.forward))
    monkeypatch.setattr(moe.GroupedGemmMLP, "forward", recording(moe.GroupedGemmMLP.forward))
    monkeypatch.setattr(moe, "_grouped_mm_fn", lambda: counting_gmm)
    assert kernels.install_moe_permute_fusion()  # what transformer_config does under the flag
    for name, function in kernels.PERMUTE_FUSION.items():
        if getattr(moe_utils, name) is function:

            def counted(*args, _name=name, _function=function, **kwargs):
                seen["permutation"].append(_name)
                return _function(*args, **kwargs)

            monkeypatch.setattr(moe_utils, name, counted)
    return seen


def _run(model, ids):
    """Logits and every parameter's gradient of a squared-logits loss."""
    model.zero_grad(set_to_none=True)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    logits = model(ids, positions, None)
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_run(got, want, atol=1e-5):
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=0)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=atol, rtol=0, msg=name)


CASES = {
    "grouped-gemm": (True, {}),
    "permute-fusion": (False, {"moe_permute_fusion": True}),
    "both": (True, {"moe_permute_fusion": True}),
}


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_logits_and_gradients_as_the_per_expert_path(case, dispatcher, hf_folder, megatron_world, spies):
    """A 2-layer Qwen3-MoE (4 experts, top-2) on 6 tokens: expert 0 of some layer gets no token (asserted),
    and logits and gradients equal megatron's per-expert, unfused path within 1e-5 (fp32)."""
    from megatron.core.transformer.moe import moe_utils

    grouped, values = CASES[case]
    folder = hf_folder("qwen3_moe")
    ids = torch.tensor([[5, 17, 42, 99, 3, 150]])
    want = _run(_build(folder, grouped=False, dispatcher=dispatcher), ids)
    assert not spies["grouped_mm"] and not spies["permutation"]
    reference_counts = list(spies["counts"])
    assert any(0 in counts for counts in reference_counts), reference_counts  # an expert without tokens
    spies["counts"].clear()

    model = _build(folder, grouped=grouped, dispatcher=dispatcher, values=values)
    assert model.config.moe_token_dispatcher_type == dispatcher
    experts = [layer.mlp.experts for layer in model.decoder.layers]
    assert all(type(e) is (moe.GroupedGemmMLP if grouped else moe.SequentialMLP) for e in experts)
    assert model.config.moe_permute_fusion is bool(values.get("moe_permute_fusion"))
    _assert_same_run(_run(model, ids), want)
    assert spies["counts"] == reference_counts  # the same routing
    # 2 layers x 2 projections: forward, input and weight gradients
    assert len(spies["grouped_mm"]) == (12 if grouped else 0)
    if values.get("moe_permute_fusion"):
        assert moe_utils.fused_permute is not None
        used = set(spies["permutation"])
        if dispatcher == "alltoall":  # tokens with probs; chunks sorted by local expert (4 local experts)
            assert used == {
                "fused_permute_with_probs",
                "fused_sort_chunks_by_index_with_probs",
                "fused_sort_chunks_by_index",
                "fused_unpermute",
            }
        else:
            assert used == {"fused_permute", "fused_unpermute"}
    else:
        assert not spies["permutation"]


def test_checkpoints_have_the_per_expert_layout(hf_folder, megatron_world):
    """GroupedGemmMLP keeps SequentialMLP's parameters and `sharded_state_dict`: the same state-dict names and
    the same torch_dist shards (key, global shape and offset), so checkpoints load either way."""

    def layout(model):
        sharded = model.sharded_state_dict()
        return {
            name: (
                getattr(v, "key", None),
                getattr(v, "global_shape", None),
                getattr(v, "global_offset", None),
            )
            for name, v in sharded.items()
        }

    folder = hf_folder("qwen3_moe")
    loop = _build(folder, grouped=False, dispatcher="alltoall")
    grouped = _build(folder, grouped=True, dispatcher="alltoall")
    assert list(loop.state_dict()) == list(grouped.state_dict())
    assert any("local_experts" in name for name in loop.state_dict())
    assert layout(grouped) == layout(loop)


def _experts(num_experts: int, *, bias: bool, glu: bool, topk: int = 2):
    """A per-expert SequentialMLP and a GroupedGemmMLP with its weights (hidden 16, expert ffn 24)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, moe_ffn_hidden_size=24,
        num_moe_experts=num_experts, moe_router_topk=topk, add_bias_linear=bias, gated_linear_unit=glu,
        activation_func=torch.nn.functional.silu if glu else torch.nn.functional.gelu,
        use_cpu_initialization=True,
    )  # fmt: skip
    submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    torch.manual_seed(0)
    loop = moe.SequentialMLP(num_experts, config, submodules, pg_collection=get_default_pg_collection())
    with torch.no_grad():
        for param in loop.parameters():
            param.normal_(0, 0.5)
    grouped = moe.GroupedGemmMLP(num_experts, config, submodules, pg_collection=get_default_pg_collection())
    grouped.load_state_dict(loop.state_dict())
    if bias:
        # megatron's expert MLP adds its fc2 bias in place; the linears' (identity) reduction on one rank makes
        # that an error, so both run as under expert parallelism, where the reduction is skipped
        for expert in (*loop.local_experts, *grouped.local_experts):
            expert.linear_fc2.explicit_expert_comm = True
    return loop, grouped


@pytest.mark.parametrize(
    "bias,glu", [(False, True), (True, True), (True, False)], ids=["swiglu", "swiglu-bias", "gelu-bias"]
)
@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 7, 0], [0, 0, 0, 0]], ids=["mixed", "one", "none"])
def test_grouped_experts_equal_the_loop(bias, glu, counts, megatron_world):
    """Biases, plain activation, experts without tokens, no tokens at all: outputs and input, probability and
    weight gradients as megatron's loop."""
    loop, grouped = _experts(len(counts), bias=bias, glu=glu)
    torch.manual_seed(1)
    x = torch.randn(sum(counts), 16)
    probs = torch.rand(sum(counts))
    results = []
    for module in (loop, grouped):
        xi, pi = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        out, out_bias = module(xi, torch.tensor(counts), pi)
        assert out_bias is None
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads = {n: p.grad for n, p in module.named_parameters()}
        results.append((out.detach(), xi.grad, pi.grad, grads))
    (out_l, gx_l, gp_l, gw_l), (out_g, gx_g, gp_g, gw_g) = results
    torch.testing.assert_close(out_g, out_l, atol=1e-5, rtol=0)
    torch.testing.assert_close(gx_g, gx_l, atol=1e-5, rtol=0)
    torch.testing.assert_close(gp_g, gp_l, atol=1e-5, rtol=0)
    for name, grad in gw_l.items():
        expected = torch.zeros_like(dict(loop.named_parameters())[name]) if grad is None else grad
        torch.testing.assert_close(gw_g[name], expected, atol=1e-5, rtol=0, msg=name)


def test_the_loop_runs_where_grouped_mm_does_not_apply(megatron_world, monkeypatch):
    """Rows that are not 16-byte multiples (here fp32 rows of 6: hidden 6) and a single local expert take
    megatron's per-expert loop."""
    assert not moe.grouped_mm_supported(torch.float32, torch.device("cpu"), 6, 48)
    assert moe.grouped_mm_supported(torch.float32, torch.device("cpu"), 16, 48)
    assert not moe.grouped_mm_supported(torch.bfloat16, torch.device("cpu"), 12, 48)  # 24 bytes
    assert not moe.grouped_mm_supported(torch.float64, torch.device("cpu"), 16, 48)
    _, single = _experts(1, bias=False, glu=True)
    called = []
    monkeypatch.setattr(moe, "_grouped_mm_fn", lambda: called.append(1))
    out, _ = single(torch.randn(5, 16), torch.tensor([5]), torch.rand(5))
    assert out.shape == (5, 16) and not called


def test_grouped_gemm_flag_reaches_the_model_args(hf_folder):
    """From the spec's values, with and without --hf-checkpoint's config.json (which knows nothing of it)."""
    folder = hf_folder("qwen3_moe")
    assert model_args_for({"moe_grouped_gemm": True}, folder).moe_grouped_gemm is True
    assert model_args_for({}, folder).moe_grouped_gemm is False
    flags = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
             "max_position_embeddings": 32, "num_experts": 4, "moe_grouped_gemm": True}  # fmt: skip
    assert model_args_for(flags).moe_grouped_gemm is True


def _routing(tokens=7, experts=4, topk=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    top = scores.topk(topk, dim=1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, top, True)
    routing_map[:, 1] = False  # expert 1 gets no token
    probs = torch.rand(tokens, experts, generator=g) * routing_map
    hidden = torch.randn(tokens, 8, generator=g)
    return hidden, probs, routing_map


def test_permutation_functions_equal_megatrons_unfused_ones():
    """Each of our TE-signature functions against megatron's unfused `permute` / `unpermute` /
    `sort_chunks_by_idxs`: outputs and gradients, probabilities included (unpermute with merging probs too)."""
    from megatron.core.transformer.moe import moe_utils

    hidden, probs, routing_map = _routing()
    count = int(routing_map.sum())

    def both(fn_ours, fn_megatron, *tensors):
        results = []
        for fn in (fn_ours, fn_megatron):
            leaves = [t.clone().requires_grad_(True) for t in tensors]
            outs = [o for o in fn(*leaves) if o is not None and o.dtype.is_floating_point]
            sum((o * torch.linspace(-1, 2, o.numel()).view_as(o)).sum() for o in outs).backward()
            results.append(([o.detach() for o in outs], [leaf.grad for leaf in leaves]))
        for got, want in zip(*[r[0] + r[1] for r in results], strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    both(
        lambda h, p: kernels.fused_permute_with_probs(h, p, routing_map, num_out_tokens=count),
        lambda h, p: moe_utils.permute(h, routing_map, probs=p, num_out_tokens=count)[:2],
        hidden,
        probs,
    )
    both(
        lambda h: kernels.fused_permute(h, routing_map, num_out_tokens=torch.tensor(count)),
        lambda h: moe_utils.permute(h, routing_map, num_out_tokens=count)[:1],
        hidden,
    )
    permuted, _, megatron_rows = moe_utils.permute(hidden, routing_map, num_out_tokens=count)[:3]
    _, ours_rows = kernels.fused_permute(hidden, routing_map, num_out_tokens=count)
    assert torch.equal(ours_rows[0], megatron_rows)  # the same order: expert-major, tokens ascending
    for merging in (None, probs):
        extra = () if merging is None else (merging,)
        both(
            lambda x, *p: (kernels.fused_unpermute(x, ours_rows, *p, restore_shape=hidden.shape),),
            lambda x, *p: (moe_utils.unpermute(x, megatron_rows, hidden.shape, *p, routing_map=routing_map),),
            permuted,
            *extra,
        )
    split_sizes = torch.tensor([3, 0, 4, 2, 5, 0])
    order = torch.tensor([2, 0, 5, 3, 1, 4])
    rows = torch.randn(14, 8)
    row_probs = torch.rand(14)
    both(
        lambda x, p: kernels.fused_sort_chunks_by_index_with_probs(x, p, split_sizes, order),
        lambda x, p: moe_utils.sort_chunks_by_idxs(x, split_sizes, order, probs=p),
        rows,
        row_probs,
    )
    both(
        lambda x: (kernels.fused_sort_chunks_by_index(x, split_sizes, order),),
        lambda x: moe_utils.sort_chunks_by_idxs(x, split_sizes, order)[:1],
        rows,
    )


def test_permute_fusion_is_installed_in_megatrons_slots():
    """Without TransformerEngine the fused names in megatron's moe_utils are ours after the install, and
    megatron's own `permute(..., fused=True)` runs them."""
    from megatron.core.transformer.moe import moe_utils

    assert kernels.install_moe_permute_fusion() is True
    for name, function in kernels.PERMUTE_FUSION.items():
        assert getattr(moe_utils, name) is function
    assert moe_utils.fused_moe_aux_loss is None  # the TE kernels we do not provide stay refused
    hidden, probs, routing_map = _routing()
    out, permuted_probs, rows = moe_utils.permute(
        hidden, routing_map, probs=probs, num_out_tokens=8, fused=True
    )[:3]
    assert out.shape == (8, 8) and permuted_probs.shape == (8,) and rows.shape == (2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert kernels.install_moe_permute_fusion() is True  # idempotent
