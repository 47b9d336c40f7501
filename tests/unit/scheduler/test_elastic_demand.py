"""Elastic rollout's platform side without a pass (docs/reference/elastic-rollout.md): the autoscaler YAML read at
submission into the demand (`scheduler.services.elastic.elastic_demand`, `jobspec.demand.elastic_rollout`), the
pass's reading of it as an elastic gang (`scheduler.scheduling`), and which engines a driver stops and starts to
follow a grant (`runtime.rollout.elastic.follow_grant`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jobspec
from jobspec.demand import ResourceDemand, elastic_rollout
from runtime.rollout.elastic import follow_grant
from scheduler import policy as P
from scheduler.domain.errors import InvalidSpec
from scheduler.scheduling import _gangs_of_text, _held
from scheduler.services.elastic import elastic_demand, is_elastic
from scheduler.services.paths import TeamStorage, resolve_spec_paths
from tests.factories import grpo_spec

YAML = "min_engines: 1\nmax_engines: 3\n"


@pytest.fixture
def storage(tmp_path: Path) -> TeamStorage:
    home = tmp_path / "home"
    (home / "artifacts").mkdir(parents=True)
    s = TeamStorage(
        home=home, artifact_root=home / "artifacts", team_id="team_a", team_name="a", pool="local"
    )
    (s.area / "models" / "tiny").mkdir(parents=True)
    (s.area / "data").mkdir()
    (s.area / "data" / "train.jsonl").write_text("{}\n")
    (s.area / "autoscaler.yaml").write_text(YAML)
    return s


def _submitted(storage: TeamStorage, **overrides: object) -> dict:
    """What submission stores as the demand: the normalized spec's, its paths resolved, the YAML read."""
    spec = {
        "colocate": False,
        "resource": {"actor": [1, 1], "rollout": [1, 2]},
        "autoscaler-config": "artifacts://autoscaler.yaml",
        **overrides,
    }
    normalized = jobspec.normalize(obj=grpo_spec(**spec))
    res = resolve_spec_paths(
        normalized.spec.to_dict(),
        storage=storage,
        job_dir=storage.job_dir("job_x"),
        find_producer=lambda r: None,
    )
    assert not res.issues, res.issues
    return elastic_demand(normalized.demand.model_dump(mode="json"), res.spec, storage)


def test_the_yaml_in_the_teams_area_makes_the_rollout_gang_elastic(storage: TeamStorage) -> None:
    demand = _submitted(storage)
    rollout = next(g for g in demand["groups"] if g["role"] == "rollout")
    assert (rollout["replicas"], rollout["min_replicas"], rollout["max_replicas"]) == (2, 1, 3)
    assert is_elastic(demand) and "rollout 2x1 GPU (elastic 1..3)" in demand["summary"]
    actor = next(g for g in demand["groups"] if g["role"] == "actor")
    assert actor["min_replicas"] is None and demand["total_gpus"] == 3  # admission places what resource asks
    # the pass's gang: elastic 1..3, holding the spec's 2 until the allocation says otherwise
    gangs = {g.role: g for g in _gangs_of_text(json.dumps(demand))}
    assert (
        gangs["rollout"].count,
        gangs["rollout"].floor,
        gangs["rollout"].base,
        gangs["rollout"].ceiling,
    ) == (
        2,
        1,
        2,
        3,
    )
    assert not gangs["actor"].elastic
    # a running job's gang holds the replicas of its allocation rows (a resize rewrote them)
    placed = [P.Assignment("actor", 0, "p/n1", 1)] + [P.Assignment("rollout", i, "p/n1", 1) for i in range(3)]
    held = {g.role: g for g in _held(tuple(gangs.values()), placed)}
    assert (held["rollout"].count, held["rollout"].base, held["rollout"].wanted) == (3, 2, 2)
    # ... and what its driver asks for (`jobs.rollout_wish`), which the pass grows it to and gives back above
    why = "rollout 0.12 of the step < scale_in 0.2"
    held = {g.role: g for g in _held(tuple(gangs.values()), placed, 1, why)}
    assert (held["rollout"].count, held["rollout"].wanted, held["rollout"].wish_reason) == (3, 1, why)
    assert held["actor"].wish is None
    # without --autoscaler-config the demand is the spec's as it was
    plain = _submitted(storage, **{"autoscaler-config": None})
    assert not is_elastic(plain) and all(g["min_replicas"] is None for g in plain["groups"])


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("min_engines: 1\nmax_engine: 3\n", {}, r"unknown key 'max_engine' \(did you mean max_engines\?\)"),
        ("min_engines: 3\nmax_engines: 4\n", {}, r"asks for 2 rollout engine\(s\), outside .* min_engines 3"),
        ("min_engines: [", {}, "not YAML"),
        ("x" * 70_000, {}, "is over 65536 bytes"),
        (YAML, {"colocate": True}, "no rollout engines on GPUs of their own"),
    ],
)
def test_a_wrong_autoscaler_config_is_refused_at_submission_naming_the_field(
    storage: TeamStorage, yaml_text: str, overrides: dict, message: str
) -> None:
    (storage.area / "autoscaler.yaml").write_text(yaml_text)
    with pytest.raises(InvalidSpec, match=message) as err:
        _submitted(storage, **overrides)
    issue = err.value.details["issues"][0]
    assert issue["field"] == "autoscaler-config" and issue["hint"]


def test_a_yaml_that_became_a_link_out_of_the_area_is_not_read(storage: TeamStorage, tmp_path: Path) -> None:
    """Resolved (and checked) with the spec's paths, the file is read without following a link: one swapped in
    since is refused, and so is a resolved path outside the team's area."""
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(YAML)
    spec = {"autoscaler_config": str(storage.area / "autoscaler.yaml")}
    demand = jobspec.normalize(
        obj=grpo_spec(colocate=False, resource={"actor": [1, 1], "rollout": [1, 1]})
    ).demand.model_dump(mode="json")
    (storage.area / "autoscaler.yaml").unlink()
    (storage.area / "autoscaler.yaml").symlink_to(outside)
    with pytest.raises(InvalidSpec, match="not a resolved path"):
        elastic_demand(demand, spec, storage)
    with pytest.raises(InvalidSpec, match="outside your team's area") as err:
        elastic_demand(demand, {"autoscaler_config": str(outside)}, storage)
    assert err.value.details["issues"][0]["code"] == "spec.path_outside_team"


def test_elastic_rollout_needs_engines_of_their_own_within_the_bounds() -> None:
    demand = jobspec.normalize(
        obj=grpo_spec(colocate=False, resource={"actor": [1, 1], "rollout": [1, 2]})
    ).demand
    assert isinstance(demand, ResourceDemand)
    bounded = elastic_rollout(demand, 2, 2)
    assert [(g.role, g.min_replicas, g.max_replicas) for g in bounded.groups] == [
        ("actor", None, None),
        ("rollout", 2, 2),
    ]
    with pytest.raises(ValueError, match=r"outside the autoscaler's min_engines 1 .. max_engines 1"):
        elastic_rollout(demand, 1, 1)


@pytest.mark.parametrize(
    ("engines", "granted", "keep", "leave", "start"),
    [
        (["a", "b"], ["a", "b"], (0, 1), (), ()),  # as granted: nothing to do
        (["a", "b", "b"], ["a", "b"], (0, 1), (2,), ()),  # one of two on b taken back: the newer leaves
        (["a", "b", "c"], ["a", "c"], (0, 2), (1,), ()),  # the pass took back b's, not the newest
        (["a"], ["a", "c", "c"], (0,), (), ("c", "c")),  # granted two on c
        (["a", "b"], ["c"], (), (0, 1), ("c",)),  # every engine moves
        ([None, None], [None], (0,), (1,), ()),  # nodes known by hostname only: by count
        (["a"], [], (0,), (), ()),  # no grant: nothing changes
    ],
)
def test_the_driver_follows_a_grant_with_the_fewest_engine_stops_and_starts(
    engines: list, granted: list, keep: tuple, leave: tuple, start: tuple
) -> None:
    plan = follow_grant(engines, granted)
    assert (plan.keep, plan.leave, plan.start) == (keep, leave, start)
