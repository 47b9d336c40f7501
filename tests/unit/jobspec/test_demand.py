"""Resource demand: GPU groups per role, colocation, nodes, and refusals with numbers."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec import SpecError, normalize

BASE: dict[str, Any] = {
    "hf_checkpoint": "/m",
    "ref_load": "/r",
    "prompt_data": "/d.jsonl",
    "rollout_batch_size": 8,
    "num_rollout": 3,
}


def demand(max_gpus_per_node: int | None = None, **spec: Any):
    return normalize(obj={**BASE, **spec}, max_gpus_per_node=max_gpus_per_node).demand


def groups(d) -> dict[str, tuple]:
    return {g.role: (g.replicas, g.gpus_per_replica, g.one_node, g.shares_with) for g in d.groups}


def refused(max_gpus_per_node: int | None = None, **spec: Any) -> list:
    with pytest.raises(SpecError) as info:
        normalize(obj={**BASE, **spec}, max_gpus_per_node=max_gpus_per_node)
    return info.value.errors


def test_colocated_rollout_shares_actor_gpus() -> None:
    d = demand(
        colocate=True,
        resource={"actor": [1, 8], "rollout": [1, 8]},
        rollout_num_gpus_per_engine=2,
        tensor_model_parallel_size=2,
    )
    assert groups(d) == {"actor": (4, 2, True, None), "rollout": (4, 2, True, "actor")}
    assert (d.total_gpus, d.nodes_needed, d.colocated, d.num_gpus_per_node) == (8, 1, True, 8)
    assert "colocated" in d.summary


def test_decoupled_roles_add_up_and_pack_nodes() -> None:
    d = demand(
        resource={"actor": [1, 4], "rollout": [1, 6]}, rollout_num_gpus_per_engine=2, num_gpus_per_node=4
    )
    assert groups(d) == {"actor": (4, 1, True, None), "rollout": (3, 2, True, None)}
    assert d.total_gpus == 10 and d.nodes_needed == 3


def test_multi_node_actor_and_engine() -> None:
    d = demand(
        colocate=True,
        resource={"actor": [1, 32], "rollout": [1, 32]},
        rollout_num_gpus_per_engine=16,
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=2,
    )
    assert groups(d)["actor"] == (2, 16, False, None)
    assert groups(d)["rollout"] == (2, 16, False, "actor")
    assert d.nodes_needed == 4


def test_fully_async_roles_and_cpu_roles() -> None:
    d = demand(
        fully_async=True,
        global_batch_size=8,
        resource={
            "actor": [1, 4],
            "rollout": [1, 2],
            "reference": [1, 1],
            "actor_fwd": [1, 1],
            "advantages": [1, 0],
        },
    )
    assert groups(d) == {
        "actor": (4, 1, True, None),
        "rollout": (2, 1, True, None),
        "reference": (1, 1, True, None),
        "actor_fwd": (1, 1, True, None),
    }
    assert d.cpu_roles == ["advantages"] and d.total_gpus == 8 and d.nodes_needed == 1


def test_hybrid_shares_actor_roles_but_not_rollout() -> None:
    d = demand(hybrid=True, resource={"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]})
    assert groups(d) == {
        "actor": (2, 1, True, None),
        "rollout": (2, 1, True, None),
        "reference": (1, 2, True, "actor"),
    }
    assert d.total_gpus == 4


def test_ppo_critic_group() -> None:
    d = demand(
        colocate=True,
        advantage_estimator="ppo",
        use_rollout_logprobs=True,
        resource={"actor": [1, 4], "critic": [1, 4], "rollout": [1, 8], "advantages": [1, 0]},
    )
    # the rollout engines span the actor's and the critic's GPUs: rollout holds them, both ride on it
    assert groups(d)["rollout"] == (8, 1, True, None)
    assert groups(d)["critic"] == (4, 1, True, "rollout") and groups(d)["actor"] == (4, 1, True, "rollout")
    assert d.total_gpus == 8
    # model-parallel actor and critic: the rollout's GPUs come in pieces each replica fills whole
    d = demand(
        colocate=True,
        advantage_estimator="ppo",
        use_rollout_logprobs=True,
        tensor_model_parallel_size=8,
        num_gpus_per_node=8,
        resource={"actor": [1, 8], "critic": [1, 8], "rollout": [1, 16], "advantages": [1, 0]},
    )
    assert groups(d)["rollout"] == (2, 8, True, None) and d.total_gpus == 16 and d.nodes_needed == 2
    assert groups(d)["critic"] == (1, 8, True, "rollout")
    # without PPO nothing changes: the actor holds the GPUs, the engines ride on it
    d = demand(colocate=True, resource={"actor": [1, 4], "rollout": [1, 4]})
    assert groups(d)["actor"] == (4, 1, True, None) and groups(d)["rollout"] == (4, 1, True, "actor")


def test_genrm_groups() -> None:
    d = demand(
        resource={"actor": [1, 4], "rollout": [1, 2]},
        genrm_model_path="/g",
        genrm_num_gpus=2,
        genrm_num_gpus_per_engine=2,
    )
    assert groups(d)["genrm"] == (1, 2, True, None) and d.total_gpus == 8
    d = demand(
        colocate=True, resource={"actor": [1, 4], "rollout": [1, 2]}, genrm_model_path="/g", genrm_num_gpus=2
    )
    assert groups(d)["genrm"][3] == "actor" and d.total_gpus == 4


def test_sft_needs_no_rollout_engines() -> None:
    d = demand(
        loss_type="sft",
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=4096,
        resource={"actor": [1, 2], "sft": [1, 0]},
    )
    assert groups(d) == {"actor": (2, 1, True, None)} and d.cpu_roles == ["sft"]


def test_missing_resource_uses_relax_legacy_actor() -> None:
    res = normalize(obj={**BASE, "colocate": True})
    assert res.demand.total_gpus == 8
    assert any(w.code == "rule.resource_needs_actor_and_rollout" for w in res.warnings)


def test_replica_larger_than_node_is_refused_with_numbers() -> None:
    (issue,) = [
        i
        for i in refused(
            resource={"actor": [1, 8], "rollout": [1, 12]},
            num_gpus_per_node=8,
            rollout_num_gpus_per_engine=12,
        )
        if i.code == "rule.rollout_engines_fit"
    ]
    assert "12" in issue.message and "8" in issue.message


def test_parallel_sizes_must_divide_actor_gpus() -> None:
    issue = next(
        i
        for i in refused(
            colocate=True, resource={"actor": [1, 6], "rollout": [1, 6]}, tensor_model_parallel_size=4
        )
        if i.code == "rule.actor_gpus_divisible_by_model_parallel"
    )
    assert "6 GPUs" in issue.message and "= 4" in issue.message
    assert {"resource", "tensor-model-parallel-size"} <= set(issue.fields)


def test_pool_node_size_refuses_and_adapts() -> None:
    assert demand(4, colocate=True, resource={"actor": [1, 4], "rollout": [1, 4]}).num_gpus_per_node == 4
    issues = refused(
        2, colocate=True, resource={"actor": [1, 4], "rollout": [1, 4]}, rollout_num_gpus_per_engine=3
    )
    assert any(i.code == "rule.pool_node_size" and "3" in i.message for i in issues)
    issues = refused(4, colocate=True, num_gpus_per_node=8, resource={"actor": [1, 4], "rollout": [1, 4]})
    assert any(i.code == "rule.pool_node_size" and "8" in i.message and "4" in i.message for i in issues)


def test_reference_and_megatron_teacher_share_the_actor() -> None:
    d = demand(
        colocate=True,
        resource={"actor": [1, 4], "rollout": [1, 4]},
        use_kl_loss=True,
        kl_loss_coef=0.01,
        use_opd=True,
        opd_type="megatron",
        opd_teacher_load="/t",
        tensor_model_parallel_size=2,
    )
    assert groups(d)["reference"] == (2, 2, True, "actor") and groups(d)["teacher"] == (2, 2, True, "actor")
    assert d.total_gpus == 4


def test_missing_resource_says_plainly_that_relax_legacy_default_applies() -> None:
    res = normalize(obj={**BASE, "colocate": True})
    assert res.demand.legacy_layout
    assert res.demand.summary.startswith(
        "--resource has no actor entry, so Relax's legacy default applies: the actor gets --actor-num-nodes 1 x "
        "--actor-num-gpus-per-node 8 = 8 GPUs."
    )
    (warning,) = [w for w in res.warnings if w.code == "rule.resource_needs_actor_and_rollout"]
    assert "legacy default" in warning.message and "8 GPUs" in warning.message
    assert not normalize(obj={**BASE, "colocate": True, "resource": {"actor": [1, 8]}}).demand.legacy_layout


def test_relax_legacy_per_role_flags_size_the_job_without_resource() -> None:
    """Given, the legacy flags become the job's --resource (rule.legacy_layout_resource); not given, Relax's
    legacy default (1 x 8 GPUs) is what the demand says applies."""
    res = normalize(obj={**BASE, "colocate": True, "actor_num_nodes": 2, "actor_num_gpus_per_node": 4})
    assert res.derived["resource"] == {"actor": [2, 8], "rollout": [1, 8]}
    assert res.demand.total_gpus == 8 and not res.demand.legacy_layout
    d = demand(actor_num_gpus_per_node=2, rollout_num_gpus=2)
    assert groups(d)["rollout"] == (2, 1, True, None) and d.total_gpus == 4
    d = demand(colocate=True)
    assert d.total_gpus == 8 and d.legacy_layout and "legacy default" in d.summary


def test_a_managed_opd_teacher_keeps_its_own_rollout_gpus_in_colocate_mode() -> None:
    spec = {
        "colocate": True,
        "use_opd": True,
        "opd_type": "sglang",
        "teacher_hf_checkpoint": "/models/teacher",
        "resource": {"actor": [1, 4], "rollout": [1, 2], "teacher": [1, 2]},
    }
    d = demand(**spec)
    assert groups(d)["rollout"][0] * groups(d)["rollout"][1] == 2 and d.total_gpus == 4


def test_an_absurd_demand_is_refused_not_computed() -> None:
    """Counts beyond any cluster are refused by their range; counts within it whose total is beyond any
    cluster by the demand."""
    from jobspec import SpecError, normalize

    argv = ["--hf-checkpoint", "/m", "--prompt-data", "/d", "--rollout-batch-size", "8", "--num-rollout", "1"]
    absurd = ["--colocate", "--resource", '{"actor": [1, 200000], "rollout": [1, 200000]}']
    with pytest.raises(SpecError) as err:
        normalize(argv=[*argv, *absurd, "--num-gpus-per-node", "200000"])
    assert {(i.code, i.field) for i in err.value.errors} == {
        ("spec.out_of_range", "resource"),
        ("spec.out_of_range", "num-gpus-per-node"),
    }
    with pytest.raises(SpecError) as err:
        normalize(argv=[*argv, "--resource", '{"actor": [100000, 100000], "rollout": [1, 8]}'])
    assert [i.code for i in err.value.errors] == ["demand.too_large"]


@pytest.mark.parametrize(
    ("spec", "layout"),
    [
        # colocated GRPO with a KL term: engines and the reference model lie on the actor's GPUs from the first
        (
            {"colocate": True, "use_kl_loss": True, "resource": {"actor": [1, 4], "rollout": [1, 4]}},
            {"actor": ("actor", 0, 4), "rollout": ("actor", 0, 4), "reference": ("actor", 0, 4)},
        ),
        # Relax's colocated PPO: the engines host; the actor takes their first GPUs, the critic the next ones
        (
            {
                "colocate": True,
                "advantage_estimator": "ppo",
                "resource": {"actor": [1, 2], "critic": [1, 2], "rollout": [1, 4], "advantages": [1, 0]},
            },
            {"actor": ("rollout", 0, 2), "critic": ("rollout", 2, 2), "rollout": ("rollout", 0, 4)},
        ),
        # decoupled: every role on GPUs of its own
        (
            {"resource": {"actor": [1, 2], "rollout": [1, 2]}},
            {"actor": ("actor", 0, 2), "rollout": ("rollout", 0, 2)},
        ),
    ],
)
def test_role_layout_is_the_one_reading_of_where_each_role_sits(spec: dict[str, Any], layout: dict) -> None:
    """`role_layout`: what the scheduler places (gangs_of) and the driver reserves (runtime.roles.placement)."""
    from jobspec.demand import role_layout

    got = role_layout(demand(**spec))
    assert {role: (r.host, r.first, r.gpus) for role, r in got.items()} == layout
