"""ParallelLayout rules, and training equality across layouts on gloo (2 processes): TP=2, PP=2, DP=2, VPP,
sequence parallel, CP=2 and EP=2 give the per-step losses of the Hugging Face model trained alone."""

from __future__ import annotations

import socket

import pytest
import torch

from runtime.train.megatron.parallel import ParallelLayout, free_port

# -- the layout ----------------------------------------------------------------------------------------------


def test_layout_dp_and_defaults():
    layout = ParallelLayout(tp=2, pp=2, world_size=8)
    assert layout.dp == 2 and layout.expert_tp == 2 and layout.virtual_stages == 1
    assert ParallelLayout().dp == 1
    assert ParallelLayout(tp=1, sequence_parallel=True, world_size=2).sequence_parallel is False
    assert ParallelLayout(pp=2, vpp=1, world_size=2).vpp is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3, "world_size": 4}, "--tensor-model-parallel-size 3 does not divide world size 4"),
        ({"pp": 3, "world_size": 4}, "--pipeline-model-parallel-size 3 does not divide world size 4"),
        ({"tp": 2, "pp": 2, "cp": 2, "world_size": 4}, r"= 8 does not divide world size 4"),
        ({"tp": 0}, "--tensor-model-parallel-size must be a positive integer"),
        (
            {"vpp": 2, "world_size": 2},
            "--num-virtual-stages-per-pipeline-rank 2 needs --pipeline-model-parallel-size > 1",
        ),
        ({"ep": 3, "world_size": 4}, "--expert-model-parallel-size 3"),
    ],
)
def test_layout_refuses_what_does_not_fit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelLayout(**kwargs)


def test_layout_from_values():
    values = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "num_layers_per_virtual_pipeline_stage": 1,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 2,
        "expert_tensor_parallel_size": None,
        "sequence_parallel": True,
        "num_layers": 4,
    }
    layout = ParallelLayout.from_values(values, world_size=8)
    assert (layout.tp, layout.pp, layout.vpp, layout.ep, layout.dp) == (2, 2, 2, 2, 2)
    assert layout.sequence_parallel and layout.expert_tp == 2
    stages = {"pipeline_model_parallel_size": 2, "num_virtual_stages_per_pipeline_rank": 2}
    assert ParallelLayout.from_values(stages, world_size=2).vpp == 2
    with pytest.raises(ValueError, match="mutually exclusive"):
        ParallelLayout.from_values({**stages, "num_layers_per_virtual_pipeline_stage": 1}, world_size=2)
    with pytest.raises(ValueError, match="needs --num-layers"):
        ParallelLayout.from_values(
            {"pipeline_model_parallel_size": 2, "num_layers_per_virtual_pipeline_stage": 1}, 2
        )
    assert ParallelLayout.from_values({}, world_size=4).dp == 4  # every dest unset: pure data parallel


def test_cp_columns_are_megatrons_load_balanced_chunks():
    from runtime.train.megatron.parallel import cp_columns, cp_gathered_columns

    assert cp_columns(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_columns(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert cp_gathered_columns(12, 3).tolist() == [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="does not split into 2 x --context-parallel-size 2"):
        cp_columns(6, 2, 0)


def test_cp_packed_columns_are_each_sequences_chunks():
    from runtime.train.megatron.parallel import cp_packed_columns

    # two sequences of 8 and 4 tokens under CP=2: chunks of 2 and 1
    assert cp_packed_columns([8, 4], 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert cp_packed_columns([8, 4], 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    assert cp_packed_columns([], 2, 0).tolist() == []


def test_free_port_is_bindable_on_loopback():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


# -- training equality on gloo -------------------------------------------------------------------------------

STEPS, LR, CLIP = 5, 1e-3, 1.0


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    torch.manual_seed(5)
    tokens = torch.randint(0, 256, (4, 17))  # 4 sequences of 16 inputs + the last label
    path = tmp_path_factory.mktemp("batch") / "tokens.pt"
    torch.save(tokens, path)
    return tokens, path


# vocab 256 = the padded size for TP 1 and 2: megatron's built-in vocab-parallel cross-entropy (used by the
# worker) then sees no padding columns and is the plain mean token cross-entropy the reference computes.
MODELS = {
    "qwen2": ("qwen2", {"vocab_size": 256, "num_hidden_layers": 4}),
    "qwen3": ("qwen3", {"vocab_size": 256}),
    "qwen3_moe": ("qwen3_moe", {"vocab_size": 256}),
}

CASES = {
    "tp2": ("qwen2", {"tp": 2}, {}),
    "pp2": ("qwen2", {"pp": 2}, {}),
    "dp2": ("qwen2", {}, {}),
    "dp2-plain-optimizer": ("qwen2", {}, {"distributed_optimizer": False}),
    "pp2-vpp2": ("qwen2", {"pp": 2, "vpp": 2}, {}),
    "tp2-sequence-parallel-qk-norm": ("qwen3", {"tp": 2, "sequence_parallel": True}, {}),
    "ep2-moe-alltoall": ("qwen3_moe", {"ep": 2}, {"values": {"moe_token_dispatcher_type": "alltoall"}}),
    "ep2-moe-allgather": ("qwen3_moe", {"ep": 2}, {"values": {"moe_token_dispatcher_type": "allgather"}}),
    # the two local experts of each rank in grouped GEMMs (moe.GroupedGemmMLP), the tokens permuted by our
    # functions in TransformerEngine's slots (kernels.install_moe_permute_fusion)
    "ep2-moe-grouped-gemm-permute-fusion": (
        "qwen3_moe",
        {"ep": 2},
        {
            "values": {
                "moe_token_dispatcher_type": "alltoall",
                "moe_grouped_gemm": True,
                "moe_permute_fusion": True,
            }
        },
    ),
    "pp2-untied-qk-norm": ("qwen3", {"pp": 2}, {}),
    # MoE with TP needs sequence parallelism (megatron's rule); experts split over the TP ranks as well
    "tp2-sequence-parallel-moe": ("qwen3_moe", {"tp": 2, "sequence_parallel": True}, {}),
    # grouped GEMMs over each expert's tensor-parallel shards (ETP = TP = 2): the dispatcher reduces, as before
    "tp2-sp-moe-grouped-gemm": (
        "qwen3_moe",
        {"tp": 2, "sequence_parallel": True},
        {"values": {"moe_grouped_gemm": True}},
    ),
    # experts whole on each rank (--expert-tensor-parallel-size 1) under TP=2: with EP=1 their gradients
    # reduce over the expert data-parallel group (model.mark_expert_data_parallel), with EP=2 megatron's own
    "tp2-sp-etp1-moe": ("qwen3_moe", {"tp": 2, "etp": 1, "sequence_parallel": True}, {}),
    "tp2-sp-ep2-etp1-moe": ("qwen3_moe", {"tp": 2, "ep": 2, "etp": 1, "sequence_parallel": True}, {}),
    # packed sequences (`thd`, cu_seqlens) through tensor / pipeline parallelism
    "tp2-packed": ("qwen3", {"tp": 2}, {"packed": True}),
    "pp2-packed": ("qwen2", {"pp": 2}, {"packed": True}),
    # context parallelism: each rank 2 of the 4 chunks of every sequence, K/V all-gathered (SDPAttention)
    "cp2": ("qwen2", {"cp": 2}, {}),
    "cp2-qk-norm-untied": ("qwen3", {"cp": 2}, {}),
    # MoE under CP: each rank routes its own chunks' tokens (the experts' replicas span the CP ranks)
    "cp2-moe": ("qwen3_moe", {"cp": 2}, {}),
    # bf16 parameters (Float16Module) with fp32 main weights: near the fp32 reference, not equal to it
    "tp2-bf16": ("qwen2", {"tp": 2}, {"values": {"bf16": True}}),
}
TOLERANCE = {"tp2-bf16": 2e-2}
SLOW = {
    "dp2-plain-optimizer",
    "tp2-sequence-parallel-qk-norm",
    "tp2-bf16",
    "ep2-moe-allgather",
    "pp2-packed",
    "pp2-untied-qk-norm",
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_two_ranks_train_like_one(case, hf_folder, batch, reference_losses, run_ranks):
    model, layout, extra = CASES[case]
    family, overrides = MODELS[model]
    folder = hf_folder(family, **overrides)
    tokens, path = batch
    expected = reference_losses(folder, tokens, steps=STEPS, lr=LR, clip=CLIP)
    job = {
        "hf": str(folder),
        "layout": layout,
        "batch": str(path),
        "steps": STEPS,
        "lr": LR,
        "clip_grad": CLIP,
        **extra,
    }
    results = run_ranks(2, job)
    values = extra.get("values", {})
    if model == "qwen3_moe":
        grouped = values.get("moe_grouped_gemm", False)
        assert all(r["experts"] == ["GroupedGemmMLP" if grouped else "SequentialMLP"] for r in results)
        assert all(r["permute_fusion"] is values.get("moe_permute_fusion", False) for r in results)
    # HF weights loaded sharded and gathered back bit for bit (in the parameters' dtype)
    assert results[0]["gathered_equal"] is True
    assert all(r["stage_equal"] for r in results)  # each rank's stage, shards all-gathered
    losses = [r["losses"] for r in results if r["losses"] is not None]
    assert losses, "no rank reported losses"
    for got in losses:
        assert got == pytest.approx(expected, abs=TOLERANCE.get(case, 1e-4))


def test_cpu_shims_map_cuda_to_cpu_and_lie_about_types_to_megatron_only(megatron_world):
    import types

    from runtime.train.megatron.cpu import install_cpu_shims, shims_active

    if torch.cuda.is_available():
        assert install_cpu_shims() is False
        return
    assert install_cpu_shims() is True and shims_active()
    assert torch.zeros(2, device="cuda").device.type == "cpu"
    assert torch.ones(1, device=torch.cuda.current_device()).device.type == "cpu"
    t = torch.zeros(2)
    assert t.cuda() is t and t.to("cuda:0").device.type == "cpu"
    fake = types.ModuleType("megatron.core.fake")
    exec("def kind(x):\n    return x.type()", fake.__dict__)
    assert fake.kind(t) == "torch.cuda.FloatTensor" and fake.kind(t.bfloat16()) == "torch.cuda.BFloat16Tensor"
    assert t.type() == "torch.FloatTensor"  # everyone else sees the truth


def test_layout_from_a_normalized_spec():
    from jobspec import normalize

    spec = {"rollout-batch-size": 4, "num-rollout": 1, "prompt-data": "/p.jsonl", "colocate": True}
    values = normalize(obj={**spec, "hf-checkpoint": "/m", "tensor-model-parallel-size": 2}).spec.to_dict()
    layout = ParallelLayout.from_values(values, world_size=4)
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.vpp, layout.dp) == (2, 1, 1, 1, None, 2)


def test_experts_are_marked_expert_data_parallel_only_when_megatron_does_not(hf_folder, megatron_world):
    """megatron marks expert weights `allreduce=False` only under EP > 1; with EP = 1 and ETP != TP their
    replicas are the expert data-parallel group all the same, so `mark_expert_data_parallel` marks them
    (every routed expert weight, nothing else); with ETP = TP or EP > 1 it leaves megatron's marks alone."""
    from runtime.train.megatron.model import mark_expert_data_parallel

    layers = torch.nn.Module()
    layers.expert = torch.nn.Linear(2, 2)
    layers.expert.is_expert = True
    layers.dense = torch.nn.Linear(2, 2)
    layers.dense.is_expert = False
    layers.dense.expert_parallel = False  # megatron's linear layers all carry this; not a mark of experts
    assert mark_expert_data_parallel(layers, ParallelLayout(tp=2, world_size=2)) == 0
    assert mark_expert_data_parallel(layers, ParallelLayout(tp=2, ep=2, etp=1, world_size=2)) == 0
    assert mark_expert_data_parallel(layers, ParallelLayout(tp=2, etp=1, world_size=2)) == 2
    assert [p.allreduce for p in layers.expert.parameters()] == [False, False]
    assert all(getattr(p, "allreduce", True) for p in layers.dense.parameters())
