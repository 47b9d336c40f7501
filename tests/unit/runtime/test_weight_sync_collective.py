"""The collective weight sync's pieces without a group: the metadata (buckets of `--update-weight-buffer-size`
bytes, SGLang's dtype names and parallel lists), the flattened payload, and the engine's side (the checks
before a byte moves, and applying buckets into a fastgen and an HF engine, draining the rest of a push when
one bucket is refused). The transport is a function from a bucket's metadata to its tensors, here read from
a state dict; the group itself (gloo) is exercised in tests/ray/test_weight_sync_collective.py and
tests/unit/runtime/sglang/test_server_distributed.py."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.devices import Device, DeviceKind
from runtime.rollout.engine import TorchRolloutEngine
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.sglang.fastgen_serving import FastGenServing
from runtime.rollout.sglang.protocol import ProtocolError
from runtime.rollout.sglang.weight_group import (
    FLATTENED,
    PushGate,
    PushOrder,
    TensorMeta,
    WeightGroup,
    WeightGroupError,
    describe,
    metas_from_request,
    pack,
    parse_dtype,
    plan_buckets,
    receive_push,
    unpack,
)
from runtime.weight_sync import WeightSyncBackend, create_weight_sync
from runtime.weight_sync.collective import (
    CollectiveWeightSource,
    CollectiveWeightSync,
    WeightPushError,
    WeightSender,
    apply_push,
    check_push,
    stage_bucket,
)
from runtime.weight_sync.select import choose_backend, requested_backend

CPU = Device(DeviceKind.CPU)


@pytest.fixture(scope="module")
def trained(tiny_model: Path) -> dict[str, torch.Tensor]:
    """The tiny model's weights after a 'training step', as the torch trainer sends them (tied lm_head left out)."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }


def order_for(
    weights: Mapping[str, torch.Tensor], *, version: int = 1, expected: int = 0, bucket_bytes: int = 16384
) -> PushOrder:
    plan = plan_buckets(describe(weights.items()), bucket_bytes)
    return PushOrder("relax-weights-test-1", 1, tuple(map(tuple, plan)), version, expected, FLATTENED)


def from_dict(weights: Mapping[str, torch.Tensor]):  # type: ignore[no-untyped-def]
    """A transport: each bucket's tensors, read as a receiver would get them (fresh copies)."""

    def receive(metas: Sequence[TensorMeta]) -> dict[str, torch.Tensor]:
        return {m.name: weights[m.name].clone() for m in metas}

    return receive


# -- metadata and payload ----------------------------------------------------------------------------------------


def test_buckets_hold_at_most_the_buffer_size_and_keep_the_order() -> None:
    metas = [
        TensorMeta(f"t{i}", "float32", (n,)) for i, n in enumerate([10, 10, 30, 5, 5])
    ]  # 40, 40, 120, 20, 20 bytes
    buckets = plan_buckets(metas, 80)
    assert [[m.name for m in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]  # t2 alone: larger
    assert [m for b in buckets for m in b] == metas
    assert plan_buckets(metas, 10**9) == [metas]
    with pytest.raises(ValueError, match="update-weight-buffer-size must be at least 1 byte, got 0"):
        plan_buckets(metas, 0)
    with pytest.raises(ValueError, match="names 't0' twice"):
        plan_buckets([*metas, metas[0]], 80)


def test_sglangs_dtype_names_and_parallel_lists_are_checked_naming_the_field() -> None:
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    assert describe([("w", torch.zeros(2, 3, dtype=torch.bfloat16))]) == [TensorMeta("w", "bfloat16", (2, 3))]
    metas = metas_from_request(["a", "b"], ["float32", "torch.int8"], [[2], [3, 1]])
    assert metas == [TensorMeta("a", "float32", (2,)), TensorMeta("b", "int8", (3, 1))]
    assert [m.nbytes for m in metas] == [8, 3]
    with pytest.raises(ValueError, match="one entry per tensor: 2, 1, 2"):
        metas_from_request(["a", "b"], ["float32"], [[2], [3]])
    with pytest.raises(ValueError, match=r"dtypes\[1\]: 'float42' is not a torch dtype name"):
        metas_from_request(["a", "b"], ["float32", "float42"], [[2], [3]])
    with pytest.raises(ValueError, match=r"shapes\[0\]: \[-1\] has a negative dimension"):
        metas_from_request(["a"], ["float32"], [[-1]])
    with pytest.raises(ValueError, match="named twice"):
        metas_from_request(["a", "a"], ["float32", "float32"], [[1], [1]])


def test_the_flattened_payload_round_trips_mixed_dtypes_at_any_offset() -> None:
    tensors = {
        "bias": torch.tensor([1, -2, 3], dtype=torch.int8),  # 3 bytes: the next tensor starts unaligned
        "w": torch.randn(2, 3),
        "h": torch.randn(4, dtype=torch.bfloat16),
        "mask": torch.tensor([True, False]),
    }
    metas = describe(tensors.items())
    flat = pack(list(tensors.values()), torch.device("cpu"))
    assert flat.dtype is torch.uint8 and flat.numel() == 3 + 24 + 8 + 2
    back = unpack(flat, metas)
    for name, tensor in tensors.items():
        assert back[name].dtype is tensor.dtype and torch.equal(back[name], tensor), name
    with pytest.raises(ValueError, match="a flattened bucket of 36 bytes holds 37 bytes of tensors"):
        unpack(torch.zeros(36, dtype=torch.uint8), metas)


@pytest.mark.parametrize("load_format", [FLATTENED, None])
def test_a_bucket_is_staged_as_the_broadcasts_the_receivers_take(
    trained: dict[str, torch.Tensor], load_format: str | None
) -> None:
    """Rank 0 copies a bucket to its device before broadcasting it (so the copies are timed apart): the
    flattened format as the one uint8 tensor a receiver allocates (`WeightGroup.receive`: every tensor's
    bytes back to back), the per-tensor format as the tensors themselves, in order."""
    bucket = plan_buckets(describe(trained.items()), 16384)[1]
    tensors = [trained[m.name] for m in bucket]
    metas, staged = stage_bucket(1, bucket, tensors, torch.device("cpu"), load_format)
    if load_format == FLATTENED:
        assert len(metas) == len(staged) == 1 and metas[0].dtype == "uint8"
        assert staged[0].numel() == metas[0].numel == sum(m.nbytes for m in bucket)
        assert metas[0].name.startswith(f"bucket 1 {[m.name for m in bucket[:3]]}")
        back = unpack(staged[0], bucket)
        assert all(torch.equal(back[m.name], t) for m, t in zip(bucket, tensors, strict=True))
    else:
        assert metas == list(bucket)
        assert all(torch.equal(a, b) for a, b in zip(staged, tensors, strict=True))


@pytest.mark.parametrize("load_format", [FLATTENED, None])
def test_rank_0_times_each_push_the_gather_the_wait_the_copies_and_the_broadcasts(
    trained: dict[str, torch.Tensor], load_format: str | None
) -> None:
    """A trainer's rank 0 alone in a gloo group (world 1: its broadcasts reach nobody, the code path is the
    same): each push's record names its size and how long each part took, the gather included."""

    class Source(CollectiveWeightSource):
        rank = 0

        def named_weights(self) -> dict[str, torch.Tensor]:
            time.sleep(0.05)  # a gather that takes a while
            return dict(trained)

    source = Source()
    assert source.weight_push_timings(1) is None  # no group yet
    source._weight_sender = WeightSender(f"relax-weights-unit-timings-{load_format}", 20.0, host="127.0.0.1")
    try:
        source.weight_group_join(1)
        plan = source.weight_push_prepare(1, 16384)
        source.weight_push_send(1, [], 5.0, load_format)
        assert source.weight_push_error(1, 20.0) is None
        timings = source.weight_push_timings(1, 20.0)
        assert timings is not None
        assert timings["tensors"] == len(trained) and timings["buckets"] == len(plan) > 1
        assert timings["bytes"] == sum(t.numel() * t.element_size() for t in trained.values())
        assert timings["gather_s"] >= 0.05
        parts = ("wait_s", "h2d_s", "broadcast_s")
        assert all(timings[k] > 0 for k in parts)
        assert timings["send_s"] >= sum(timings[k] for k in parts)
        assert source.weight_push_timings(2, 0.1) is None  # an unknown push
    finally:
        source.weight_group_close()


# -- the engine's side --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fastgen", "hf"])
def test_a_push_is_applied_bucket_by_bucket_and_takes_the_drivers_version(
    tiny_model: Path, trained: dict[str, torch.Tensor], kind: str
) -> None:
    engine = (
        FastGenEngine(str(tiny_model), device=CPU, max_batch_size=2)
        if kind == "fastgen"
        else TorchRolloutEngine(str(tiny_model), device=CPU)
    )
    order = order_for(trained, version=4, expected=0)
    assert len(order.buckets) > 3 and check_push(engine, order, "engine0") is None
    assert apply_push(engine, order, from_dict(trained), "engine0") == 4
    assert engine.weight_version == 4  # the driver's version (versions may skip), not the engine's count
    held = (
        {n: engine.weights.target(n) for n in engine.weights.hf}
        if kind == "fastgen"
        else engine.model.state_dict()
    )
    for name, tensor in trained.items():
        assert torch.equal(held[name], tensor), name


@pytest.mark.parametrize("kind", ["fastgen", "hf"])
def test_the_checks_before_a_byte_moves_name_the_engine_the_versions_and_the_tensors(
    tiny_model: Path, trained: dict[str, torch.Tensor], kind: str
) -> None:
    engine = (
        FastGenEngine(str(tiny_model), device=CPU, max_batch_size=2)
        if kind == "fastgen"
        else TorchRolloutEngine(str(tiny_model), device=CPU)
    )
    engine.weight_version = 3
    what = r"engine2: weight push 1 \(version \d+, group 'relax-weights-test-1'\)"
    assert check_push(engine, order_for(trained, version=3, expected=3), "engine2") is None  # a repeat (SFT)
    assert check_push(engine, order_for(trained, version=4, expected=2), "engine2") == (
        "engine2: weight push 1 (version 4, group 'relax-weights-test-1'): the engine holds version 3, "
        "the driver expected 2"
    )
    assert "older than the engine's version 3" in str(
        check_push(engine, order_for(trained, version=2, expected=3), "engine2")
    )
    partial = {k: v for k, v in trained.items() if k != "model.layers.1.mlp.up_proj.weight"}
    assert check_push(engine, order_for(partial, version=4, expected=3), "engine2") == (
        "engine2: weight push 1 (version 4, group 'relax-weights-test-1') is missing: "
        "['model.layers.1.mlp.up_proj.weight']"
    )
    extra = {**trained, "model.layers.9.mlp.up_proj.weight": torch.zeros(2)}
    assert "names unknown tensors: ['model.layers.9.mlp.up_proj.weight']" in str(
        check_push(engine, order_for(extra, version=4, expected=3), "engine2")
    )
    wrong = {**trained, "model.norm.weight": torch.zeros(7)}
    import re

    message = str(check_push(engine, order_for(wrong, version=4, expected=3), "engine2"))
    assert re.match(what + r" has wrong shapes: \['model.norm.weight \(7,\) != \(64,\)'\]", message), message
    # a tied lm_head sent anyway is accepted (and ignored)
    tied = {**trained, "lm_head.weight": trained["model.embed_tokens.weight"]}
    assert check_push(engine, order_for(tied, version=4, expected=3), "engine2") is None


def test_a_refused_bucket_still_drains_the_push_then_fails_naming_it(
    tiny_model: Path, trained: dict[str, torch.Tensor]
) -> None:
    engine = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=2)
    order = order_for(trained, version=1, expected=0)
    received: list[int] = []
    honest = from_dict(trained)

    def transport(metas: Sequence[TensorMeta]) -> dict[str, torch.Tensor]:
        received.append(len(received))
        tensors = honest(metas)
        if len(received) == 2:  # the second bucket arrives corrupted (a sender that lied about a shape)
            name = metas[0].name
            tensors[name] = tensors[name].reshape(-1)[:1]
        return tensors

    with pytest.raises(WeightPushError, match=r"engine0: weight push 1 \(version 1.*\): bucket 1 \(\['model"):
        apply_push(engine, order, transport, "engine0")
    assert len(received) == len(order.buckets)  # every bucket received: the trainer and the others finish
    assert engine.weight_version == 0

    seen: list[int] = []
    with pytest.raises(KeyError, match="boom"):
        receive_push(
            [[], [], []],
            lambda metas: {},
            lambda i, t: seen.append(i) or (_ for _ in ()).throw(KeyError("boom")),
        )
    assert seen == [0]


def test_our_server_refuses_a_repeated_tensor_and_the_rest_of_a_refused_update(
    tiny_model: Path, trained: dict[str, torch.Tensor]
) -> None:
    """`/update_weights_from_distributed`'s bookkeeping in the fastgen serving engine (buckets already
    received): a tensor sent twice is refused, the update's later buckets are refused naming the first
    reason, and its closing bucket does not take the version; the next update starts clean."""
    serving = FastGenServing.from_checkpoint(str(tiny_model), None, device=CPU, max_batch_size=2)
    names = list(trained)
    first, second = {n: trained[n] for n in names[:5]}, {n: trained[n] for n in names[5:]}
    serving.update_weights_from_distributed(first)
    with pytest.raises(ProtocolError, match="sends .* twice"):
        serving.update_weights_from_distributed({names[0]: trained[names[0]]})
    with pytest.raises(
        ProtocolError, match="an earlier bucket of this weight update was refused: weight update sends"
    ):
        serving.update_weights_from_distributed(second, weight_version="1")
    assert serving.weight_version == "default"
    serving.update_weights_from_distributed(first)
    assert (
        serving.update_weights_from_distributed(second, weight_version="1")
        == "Succeeded to update parameter online."
    )
    assert serving.weight_version == "1"
    for name, tensor in trained.items():
        assert torch.equal(serving.named_weight(name), tensor), name


def test_the_push_gate_bounds_each_wait_and_a_timeout_or_cancel_aborts_the_push_for_everyone() -> None:
    import threading

    store = WeightGroup.serve_store("127.0.0.1", timeout_s=10.0)
    engine, trainer = PushGate(store, "g", 7), PushGate(store, "g", 7)
    with pytest.raises(
        WeightGroupError, match=r"^weight push 7: engine1 got no go-ahead from the trainer after 0 s$"
    ):
        engine.wait_go("engine1", 0.05)
    with pytest.raises(WeightGroupError, match=r"^weight push 7 aborted: engine1 got no go-ahead"):
        trainer.wait_ready(["engine1"], 10.0)  # the engine's timeout reached the trainer

    later = PushGate(store, "g", 8)
    later.ready("engine1")
    later.wait_ready(["engine1"], 1.0)  # every member ready: returns
    with pytest.raises(
        WeightGroupError, match=r"^weight push 8: \['engine2'\] not ready to receive after 0 s$"
    ):
        later.wait_ready(["engine1", "engine2"], 0.05)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(WeightGroupError, match=r"^weight push 9 cancelled$"):
        PushGate(store, "g", 9).wait_ready(["engine1"], 10.0, cancelled)
    with pytest.raises(WeightGroupError, match=r"^weight push 9 aborted: the trainer cancelled it$"):
        PushGate(store, "g", 9).wait_go("engine1", 10.0)


def test_the_backend_is_registered_under_the_name_relax_users_know() -> None:
    sync = create_weight_sync(WeightSyncBackend.COLLECTIVE)
    assert isinstance(sync, CollectiveWeightSync) and WeightSyncBackend.COLLECTIVE == "nccl"
    with pytest.raises(ValueError, match="update-weight-buffer-size must be at least 1 byte"):
        CollectiveWeightSync(bucket_bytes=0)


def test_the_layout_picks_the_backend_with_a_faked_gpu_device() -> None:
    """`weight_sync.select`: a GPU device descriptor is faked (nothing here has a GPU); no GPU code runs."""
    gpu, cpu = Device(DeviceKind.CUDA), Device(DeviceKind.CPU)

    def pick(**kw: object) -> WeightSyncBackend:
        layout = {"engines_in_trainer": False, "takes_turns": False, "external_engines": False, "device": gpu}
        return choose_backend(**{**layout, **kw})[0]  # type: ignore[arg-type]

    assert pick() is WeightSyncBackend.COLLECTIVE  # the job's own engines on GPUs of their own
    assert pick(device=cpu) is WeightSyncBackend.OBJECT_STORE
    assert pick(takes_turns=True) is WeightSyncBackend.OBJECT_STORE  # NCCL: no two ranks on one GPU
    assert pick(external_engines=True) is WeightSyncBackend.OBJECT_STORE
    assert pick(engines_in_trainer=True, requested=WeightSyncBackend.COLLECTIVE) is WeightSyncBackend.IN_PLACE
    assert (
        pick(device=cpu, requested=WeightSyncBackend.COLLECTIVE) is WeightSyncBackend.COLLECTIVE
    )  # over gloo
    assert pick(requested=WeightSyncBackend.OBJECT_STORE) is WeightSyncBackend.OBJECT_STORE
    assert requested_backend("") is None and requested_backend(" NCCL ") is WeightSyncBackend.COLLECTIVE
    for bad in ("in_place", "disk"):
        with pytest.raises(ValueError, match=rf"RELAX_WEIGHT_SYNC='{bad}': use one of object_store, nccl"):
            requested_backend(bad)


def test_update_weight_buffer_size_sets_the_collective_weight_syncs_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--update-weight-buffer-size` is read where the job's weight sync is made (`weight_sync_for`): the
    collective sync's bucket bytes, its default where the spec leaves it unset (a GPU device faked)."""
    from types import SimpleNamespace

    from runtime.weight_sync.collective import DEFAULT_BUCKET_BYTES
    from runtime.weight_sync.select import weight_sync_for

    monkeypatch.delenv("RELAX_WEIGHT_SYNC", raising=False)
    roles = SimpleNamespace(infos=[{}], engines_in_trainer=False, takes_turns=False)
    gpu = Device(DeviceKind.CUDA)
    sized = weight_sync_for(roles, gpu, {"update_weight_buffer_size": 3 << 20})  # type: ignore[arg-type]
    assert isinstance(sized, CollectiveWeightSync) and sized.bucket_bytes == 3 << 20
    unset = weight_sync_for(roles, gpu, {})  # type: ignore[arg-type]
    assert isinstance(unset, CollectiveWeightSync) and unset.bucket_bytes == DEFAULT_BUCKET_BYTES != 3 << 20
