"""Fully-async staleness accounting, role placement, capability restrictions, actor log forwarding."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.capabilities import RESOURCE_ROLES, unsupported_parameters
from runtime.devices import Device, DeviceKind
from runtime.roles.logs import ActorLogHandler, LogSink, log_exceptions
from runtime.roles.placement import COLOCATED_GROUP, SUPPORTED_ROLES, Role, UnsupportedTopology, plan_topology
from runtime.rollout.sources import StalenessGate

CPU = Device(DeviceKind.CPU)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=4), st.integers(min_value=1, max_value=12), st.randoms())
def test_fully_async_schedule_never_exceeds_max_staleness(
    max_staleness: int, steps: int, rng: random.Random
) -> None:
    """Interleave a generator (starts rollouts when the gate allows) and a trainer at random: every rollout
    is generated with weights at most `max_staleness` updates behind the policy that trains on it, and the
    generator does run ahead when allowed."""
    gate = StalenessGate(max_staleness, trained=0)
    generated_with: dict[int, int] = {}  # rollout id -> weight version (= steps trained when it started)
    next_gen = trained = 0
    furthest_ahead = 0
    while trained < steps:
        can_generate = next_gen < steps and gate.may_start(next_gen)
        if can_generate and (next_gen <= trained or rng.random() < 0.6):
            generated_with[next_gen] = trained
            furthest_ahead = max(furthest_ahead, next_gen - trained)
            next_gen += 1
        elif trained in generated_with:
            assert trained - generated_with[trained] <= max_staleness
            trained += 1
            gate.trained = trained
    assert furthest_ahead <= max_staleness
    assert StalenessGate(max_staleness, 0).may_start(max_staleness)
    assert not StalenessGate(max_staleness, 0).may_start(max_staleness + 1)


def test_placement_groups_per_role() -> None:
    colocated = plan_topology(
        {"actor": [1, 1], "rollout": [1, 4]}, colocate=True, with_rollout=True, device=CPU
    )
    assert colocated.groups == {COLOCATED_GROUP: 1} and colocated.slots[Role.ROLLOUT][0].share == 0.5
    separate = plan_topology(
        {"actor": [1, 1], "rollout": [2, 2], "reference": [1, 1]},
        colocate=False,
        with_rollout=True,
        device=CPU,
        separate_roles=(Role.REFERENCE,),
    )
    assert separate.groups == {"actor": 1, "rollout": 2, "reference": 1}
    assert [s.group for s in separate.rollout_slots] == ["rollout", "rollout"]
    rollout_only = plan_topology(
        {"rollout": [1, 1]}, colocate=False, with_rollout=True, with_train=False, device=CPU
    )
    assert rollout_only.groups == {"rollout": 1} and not rollout_only.train_slots
    with pytest.raises(UnsupportedTopology, match="genrm"):
        plan_topology({"actor": [1, 1], "genrm": [1, 1]}, colocate=False, with_rollout=True, device=CPU)
    # PPO (Relax's colocated layout, as jobspec.demand reads it): the engines span the actor's slot and the
    # critic's, each of which shares its slot with one engine; `advantages` (Relax's CPU-only role) none
    ppo = plan_topology(
        {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 2], "advantages": [1, 0]},
        colocate=True,
        with_rollout=True,
        device=CPU,
        with_critic=True,
    )
    assert ppo.groups == {COLOCATED_GROUP: 2} and ppo.colocate
    assert [(s.bundle_index, s.share) for s in ppo.role_slots(Role.ACTOR)] == [(0, 0.5)]
    assert [(s.bundle_index, s.share) for s in ppo.role_slots(Role.CRITIC)] == [(1, 0.5)]
    assert [s.bundle_index for s in ppo.role_slots(Role.ROLLOUT)] == [0, 1]
    with pytest.raises(UnsupportedTopology, match="critic"):
        plan_topology(
            {"actor": [1, 1], "critic": [1, 2]},
            colocate=True,
            with_rollout=True,
            device=CPU,
            with_critic=True,
        )
    with pytest.raises(UnsupportedTopology, match="one device"):
        plan_topology({"actor": [1, 2]}, colocate=False, with_rollout=False, device=CPU)
    assert {str(r) for r in SUPPORTED_ROLES} == RESOURCE_ROLES


def test_capabilities_name_what_is_refused() -> None:
    defaults = {"max_staleness": 0, "use_tis": False, "resource": None}
    ok = {
        "fully_async": True,
        "max_staleness": 2,
        "partial_rollout": True,
        "rotate_ckpt": True,
        "eval_size": 0.1,
    }
    assert unsupported_parameters(ok, defaults) == []
    assert unsupported_parameters({"max_staleness": 1}, defaults) == ["max_staleness=1"]
    assert unsupported_parameters({"resource": {"actor": [1, 1], "genrm": [1, 1]}}, defaults) == [
        "resource={'actor': [1, 1], 'genrm': [1, 1]}"
    ]
    # a critic on two devices: two megatron-core ranks (data parallel here); the torch critic is one process
    two = {"resource": {"actor": [1, 1], "critic": [1, 2]}}
    assert unsupported_parameters(two, defaults) == []
    assert unsupported_parameters({**two, "train_backend": "torch"}, defaults) == [
        "resource={'actor': [1, 1], 'critic': [1, 2]}"
    ]
    # PPO takes the trainer's old log-probs without --use-rollout-logprobs, the engine's with it
    ppo = {"resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 2], "advantages": [1, 0]}}
    for backend in ("torch", "megatron"):
        job = {**ppo, "advantage_estimator": "ppo", "use_tis": True, "train_backend": backend}
        assert unsupported_parameters(job, defaults) == []
        assert unsupported_parameters({**job, "use_rollout_logprobs": True}, defaults) == []
    assert unsupported_parameters({"rm_type": "ifbench"}, defaults) == ["rm_type='ifbench'"]
    assert unsupported_parameters({"rm_type": "mathh"}, defaults) == ["rm_type='mathh'"]
    assert unsupported_parameters({"rm_type": "mathh", "rm_type_fallback": "zero"}, defaults) == []
    assert unsupported_parameters({"rm_type": "boxed_f1", "rm_url": "http://rm"}, defaults) == []
    assert unsupported_parameters({"rollout_external": True}, defaults) == ["rollout_external=True"]
    assert unsupported_parameters({"debug_train_only": True}, defaults) == ["debug_train_only=True"]
    # Relax's SFT scripts set it (SFT starts no engines), unless predictions need them
    assert unsupported_parameters({"debug_train_only": True, "loss_type": "sft"}, defaults) == []
    assert unsupported_parameters(
        {"debug_train_only": True, "loss_type": "sft", "sft_predict_interval": 5}, defaults
    ) == ["debug_train_only=True"]
    assert unsupported_parameters({"eval_config": "e.yaml", "loss_type": "sft"}, defaults) == [
        "eval_config='e.yaml'"
    ]
    assert (
        unsupported_parameters(
            {"rollout_function_path": "my.mod.fn", "data_source_path": "my.Source"}, defaults
        )
        == []
    )


class _Remote:
    def __init__(self, sink: LogSink) -> None:
        self.remote = sink.put


class _SinkHandle:
    """Stands in for the sink's actor handle: `.put.remote(items)` calls it directly."""

    def __init__(self) -> None:
        self.sink = LogSink()
        self.put = _Remote(self.sink)


def test_actor_logs_and_exceptions_reach_the_sink() -> None:
    handle = _SinkHandle()
    logger = logging.getLogger("runtime.test_actor")
    handler = ActorLogHandler(handle, "actor:train")  # type: ignore[arg-type]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    @log_exceptions
    class Role_:
        def boom(self) -> None:
            raise ValueError("bad batch")

    logging.getLogger("runtime.roles.Role_").addHandler(handler)
    try:
        logger.info("loaded %d weights", 3)
        logging.getLogger("other.lib").info("not forwarded: below WARNING outside runtime")
        with pytest.raises(ValueError):
            Role_().boom()
    finally:
        logger.removeHandler(handler)
        logging.getLogger("runtime.roles.Role_").removeHandler(handler)
    items = handle.sink.drain()
    assert items[0]["source"] == "actor:train" and items[0]["message"].endswith("loaded 3 weights")
    assert items[1]["level"] == "ERROR" and "Role_.boom failed" in items[1]["message"]
    assert "ValueError: bad batch" in items[1]["message"] and "Traceback" in items[1]["message"]
    assert handle.sink.drain() == []
