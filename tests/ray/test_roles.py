"""Role actors on a real local Ray: one placement group per role, weight sync (rollout log-probs equal the
trainer's right after a sync, and not before), forward-only reference role, actor logs and exceptions."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import ray

from runtime.data.prompts import DatasetConfig, PromptFormatter, read_prompt_items
from runtime.devices import Device
from runtime.roles.actors import RolloutEngineActor
from runtime.roles.elastic import EngineStarter
from runtime.roles.groups import EngineKind, RolePlan, Roles, start_roles
from runtime.roles.placement import Role
from runtime.rollout.elastic import AutoscalerConfig, ElasticSettings, PartialSuccessPolicy
from runtime.rollout.engine import SamplingParams
from runtime.rollout.generate import GenerateContext, LengthLimits, advance
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TrainConfig
from runtime.types import RolloutBatch, Sample
from runtime.weight_sync import WeightSyncBackend, create_weight_sync

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def page_cache_markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("node")


@pytest.fixture(scope="module")
def roles(ray_local, artifacts: dict[str, Path], page_cache_markers: Path):  # type: ignore[no-untyped-def]
    plan = RolePlan(
        backend="torch",
        hf_checkpoint=str(artifacts["warm"]),
        # an SFT loss: any batch moves the weights (a GRPO step on equal rewards would not)
        train_config=TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=5e-3), weight_decay=0.0),
        resource={"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1]},
        colocate=False,
        # the built-in engine in the rollout actors themselves: the roles, their groups, weight sync and the
        # elastic mechanics are what this module checks, not the engine's server. Engine servers (HTTP) are
        # started, synced, scaled out and replaced through the driver in test_driver_grpo.py and
        # test_rollout_health.py, and scaled in and out by the pass in tests/e2e/test_elastic_rollout.py. Five
        # engine actors start here (two, then three in the elastic test, one of which fails); each HTTP one
        # starts a server process too (elastic test 52.2 -> 22.5 s, the module's processes 110 -> 80 s of CPU)
        engine_kind=EngineKind.IN_PROCESS,
        separate={Role.REFERENCE: str(artifacts["warm"])},
        warm_page_cache=(str(artifacts["warm"]),),  # --warm-hf-checkpoint-page-cache
        # --autoscaler-config: test_elastic_rollout_* scales the engines
        elastic=ElasticSettings(AutoscalerConfig(min_engines=1, max_engines=3), scale_out_timeout_s=120.0),
    )
    running = start_roles(
        plan, device=Device.detect(), env_vars={"RELAX_PAGE_CACHE_DIR": str(page_cache_markers)}
    )
    try:
        yield running
    finally:
        running.shutdown()


def _rollout(roles: Roles, artifacts: dict[str, Path], seed: int) -> RolloutBatch:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(artifacts["warm"])
    config = DatasetConfig(label_key="label")
    formatter = PromptFormatter(tok, config)
    items = read_prompt_items(artifacts["train_small"], config)[:8]
    samples = [
        Sample(i, i // 2, it.prompt, label=it.label, tokens=formatter.encode(it.prompt))
        for i, it in enumerate(x for x in items for _ in range(2))
    ]
    ctx = GenerateContext(roles.rollout, tok, SamplingParams(max_new_tokens=8, seed=seed), LengthLimits(8), 0)  # type: ignore[arg-type]
    advance(samples, ctx)
    for s in samples:
        s.reward = float(s.response.startswith(f"\\boxed{{{s.label}}}"))
    return RolloutBatch.from_samples(samples, tok.pad_token_id)


def _gap(batch: RolloutBatch) -> float:
    assert batch.old_log_probs is not None
    return float(((batch.old_log_probs - batch.rollout_log_probs).abs() * batch.loss_mask).max())


def test_each_role_has_its_own_placement_group(roles: Roles) -> None:
    """One group a role; the elastic rollout (--autoscaler-config) one group an engine, each its own device."""
    assert {name: pg.bundle_count for name, pg in roles.placement_groups.items()} == {
        "actor": 1,
        "rollout-engine-0": 1,
        "rollout-engine-1": 1,
        "reference": 1,
    }
    pg_of = {name: pg.id.hex() for name, pg in roles.placement_groups.items()}
    by_role: dict[str, set[str]] = {}
    for info in roles.infos:
        by_role.setdefault(info["role"], set()).add(info["placement_group"])
    assert by_role == {
        "actor": {pg_of["actor"]},
        "rollout": {pg_of["rollout-engine-0"], pg_of["rollout-engine-1"]},
        "reference": {pg_of["reference"]},
    }
    assert len(set(pg_of.values())) == 4


def test_the_roles_warm_the_checkpoint_once_per_node(
    roles: Roles, artifacts: dict[str, Path], page_cache_markers: Path
) -> None:
    """Every role's process (trainer, two engines, reference) asked to warm the policy's folder before loading
    it; one of them streamed it, the others found it done."""
    (done,) = (page_cache_markers / "relax-page-cache").glob("*.done")
    folder, size = done.read_text().split()
    size_on_disk = sum(
        p.stat().st_size for p in artifacts["warm"].rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert Path(folder) == artifacts["warm"].resolve() and int(size) == size_on_disk


def test_rollout_log_probs_equal_trainer_log_probs_right_after_a_sync(
    roles: Roles, artifacts: dict[str, Path]
) -> None:
    assert roles.train is not None and roles.rollout is not None and roles.reference is not None
    sync = create_weight_sync(WeightSyncBackend.OBJECT_STORE)
    batch = _rollout(roles, artifacts, seed=1)
    batch = roles.train.compute_log_probs(batch, ref=False)
    assert _gap(batch) < 1e-5  # same starting weights everywhere
    reference = roles.reference.log_probs(batch)
    assert float((reference - batch.old_log_probs).abs().max()) < 1e-5  # type: ignore[operator]

    roles.train.train_step(batch)
    stale = roles.train.compute_log_probs(_rollout(roles, artifacts, seed=2), ref=False)
    assert _gap(stale) > 1e-3  # engines still hold the old weights

    sync.push(roles.train, [roles.rollout], version=1)
    fresh = roles.train.compute_log_probs(_rollout(roles, artifacts, seed=3), ref=False)
    assert _gap(fresh) < 1e-5
    # the reference role kept the initial weights until it is pushed to
    after = roles.reference.log_probs(fresh)
    assert float((after - fresh.old_log_probs).abs().max()) > 1e-3  # type: ignore[operator]
    sync.push(roles.train, [roles.reference], version=1)
    assert float((roles.reference.log_probs(fresh) - fresh.old_log_probs).abs().max()) < 1e-5  # type: ignore[operator]


def test_actor_logs_and_exceptions_are_forwarded(roles: Roles, tmp_path: Path) -> None:
    assert roles.train is not None and roles.log_sink is not None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7\n")  # points at a missing iter_0000007
    with pytest.raises(ray.exceptions.RayTaskError):
        roles.train.load_checkpoint(str(tmp_path))
    items: list[dict] = []
    deadline = time.time() + 10
    while time.time() < deadline and not any("load_checkpoint failed" in i["message"] for i in items):
        items += ray.get(roles.log_sink.drain.remote())
        time.sleep(0.2)
    sources = {i["source"] for i in items}
    assert {"actor:train", "actor:rollout0", "actor:rollout1", "actor:reference"} <= sources
    assert any("train backend ready" in i["message"] for i in items)
    failure = next(i for i in items if "TrainActor.load_checkpoint failed" in i["message"])
    assert (
        failure["level"] == "ERROR"
        and "Traceback" in failure["message"]
        and failure["source"] == "actor:train"
    )


def test_elastic_rollout_grows_with_the_current_weights_and_shrinks_draining_requests(
    roles: Roles, artifacts: dict[str, Path]
) -> None:
    """--autoscaler-config (runtime/roles/elastic.py) on real engine actors, each in a placement group of its own
    (released when it stops, so its device goes back to Ray). A scale-out onto a Ray node that does not exist
    (a grant the cluster cannot hold) adds nothing and is not tried again for the same grant; of two engines
    where the second cannot start, --scale-out-partial-success-policy keep_partial keeps the first
    (rollback_all's choice is `settle_scale_out`'s, unit-tested), and it holds the weights the others hold:
    its samples' log-probs equal the trainer's. Scale-in lets the leaving engine finish its in-flight request
    (--scale-in-drain-timeout), or stops it past the timeout. Placed by the scheduling pass, the engines follow
    its grant: every engine moves onto the Ray node granted. Three engine starts in all (each costs seconds)."""
    assert roles.train is not None and roles.rollout is not None and roles.rollout.elastic is not None
    group, elastic = roles.rollout, roles.rollout.elastic
    settings = elastic.settings
    pgs = roles.placement_groups
    assert [h.group for h in elastic.homes] == ["rollout-engine-0", "rollout-engine-1"]
    assert all(len(pgs[h.group].bundle_specs) == 1 for h in elastic.homes if h.group)

    def scaled() -> list[str]:
        return sorted(name for name in pgs if name.startswith("rollout-scaled"))

    sync = create_weight_sync(WeightSyncBackend.OBJECT_STORE)
    roles.train.train_step(roles.train.compute_log_probs(_rollout(roles, artifacts, seed=4), ref=False))
    sync.push(roles.train, [group], version=7)

    # a grant onto a node Ray does not have: its group is never reserved, the engine never ready
    elastic.settings = dataclasses.replace(settings, scale_out_timeout_s=1.0)  # it is never reserved
    nowhere = ("f" * 56,)
    elastic.follow_grant((None, None, *nowhere))
    assert len(group.actors) == 2 and elastic.scale_out_failures == 1 and scaled() == []
    started = time.monotonic()
    assert elastic.follow_grant((None, None, *nowhere)) is None  # the same grant: not tried again
    assert time.monotonic() - started < 1.0 and elastic.scale_out_failures == 1

    # engine 2 starts for real; engine 3 cannot (its checkpoint does not exist): keep_partial keeps engine 2
    broken = EngineStarter(RolloutEngineActor, ("unused",), {}, Device.detect(), pgs)
    good = elastic.start_engine
    elastic.start_engine = lambda index, node: (good if index == 2 else broken)(index, node)
    elastic.settings = dataclasses.replace(
        settings, partial_success=PartialSuccessPolicy.KEEP_PARTIAL, scale_out_timeout_s=120.0
    )
    kept = elastic.scale_out(2)
    elastic.start_engine = good
    assert (kept.before, kept.after, list(kept.failures)) == (2, 3, [3]), kept.failures
    assert len(scaled()) == 1 and len(elastic.homes) == 3  # engine 3's group was released with it
    fresh = roles.train.compute_log_probs(_rollout(roles, artifacts, seed=5), ref=False)  # a share per engine
    assert _gap(fresh) < 1e-5  # the new engine too generates with the trainer's weights (version 7)

    elastic.settings = settings
    prompt = [[1, 2, 3]] * 4
    in_flight = group.actors[-1].generate.remote(prompt, SamplingParams(max_new_tokens=32, seed=0))
    shrunk = elastic.scale_in(1)
    assert (shrunk.before, shrunk.after, shrunk.aborted) == (3, 2, 0) and len(group.actors) == 2
    assert len(ray.get(in_flight)) == 4  # drained: its request finished before it stopped
    assert scaled() == []  # and its device is Ray's again

    elastic.settings = dataclasses.replace(settings, drain_timeout_s=0.01)
    leaving = group.actors[-1]
    busy = leaving.generate.remote(prompt * 64, SamplingParams(max_new_tokens=250, min_new_tokens=250))
    cut = elastic.scale_in(1)
    assert (cut.after, cut.aborted) == (1, 1)  # still generating past the drain timeout: stopped
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(leaving.ready.remote(), timeout=60)
    ray.wait([busy], timeout=60)  # killed mid-request, or done just before: never left hanging
    assert "rollout-engine-1" not in pgs and "rollout-engine-0" in pgs

    # placed by the pass: the engine follows its grant onto the Ray node it names (this node, by its id)
    elastic.settings = settings
    here = ray.get_runtime_context().get_node_id()
    elastic.placed, elastic.follow = True, lambda: (here,)
    metrics = elastic.after_step(9, rollout_s=0.1, step_s=10.0)  # the thresholds are not asked
    assert metrics["rollout/engines"] == 1.0 and metrics["rollout/granted_engines"] == 1.0
    assert [h.node for h in elastic.homes] == [here] and "rollout-engine-0" not in pgs
    (name,) = scaled()
    table = ray.util.placement_group_table(pgs[name])
    assert table["state"] == "CREATED" and set(table["bundles_to_node_id"].values()) == {here}
    assert len(_rollout(roles, artifacts, seed=6).rewards) == 16  # the moved engine generates
