"""Spec paths stay inside the submitting team (SQLite and PostgreSQL): each escape of the trust issue is
refused at submission and in the dry run with the field named; path grants (admin CRUD, `relaxctl admin
grants`) open exactly what they say; `GET /v1/storage` tells a team where its area is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.db.models import Job
from scheduler.services.reports import JobReports
from tests.factories import grpo_spec, seed_area


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _team(client: TestClient, name: str) -> tuple[str, str]:
    """A team with a queue and a member key: (team id, key)."""
    r = client.post("/v1/teams", json={"name": name})
    assert r.status_code == 201, r.text
    q = client.post(
        "/v1/queues", json={"name": f"{name}-q", "pool": "local", "team": name, "nominal_gpus": 1}
    )
    assert q.status_code == 201, q.text
    k = client.post("/v1/api-keys", json={"name": f"{name}-member", "role": "member", "team": name})
    assert k.status_code == 201, k.text
    return r.json()["id"], k.json()["key"]


class Teams:
    def __init__(self, api: Any, outside: Path) -> None:
        self.client, self.settings, _ = api
        self.home: Path = self.settings.home
        self.a, self.a_key = _team(self.client, "alpha")
        self.b, self.b_key = _team(self.client, "beta")
        for team in (self.a, self.b):
            seed_area(self.settings.artifacts, team)
        r = self.client.post("/v1/jobs", json={"name": "b-sft", "spec": grpo_spec()}, headers=_as(self.b_key))
        assert r.status_code == 201, r.text
        self.b_job = r.json()
        Path(self.b_job["output_dir"], "hf").mkdir(parents=True)
        self.outside = outside  # storage outside the platform's home (tmp_path is the home here)

    def submit(self, key: str | None = None, **overrides: Any) -> Any:
        return self.client.post(
            "/v1/jobs", json={"spec": grpo_spec(**overrides)}, headers=_as(key or self.a_key)
        )

    def validate(self, key: str | None = None, **overrides: Any) -> dict[str, Any]:
        r = self.client.post(
            "/v1/specs/validate", json={"spec": grpo_spec(**overrides)}, headers=_as(key or self.a_key)
        )
        assert r.status_code == 200, r.text
        return r.json()

    def refused(self, field: str, code: str = "spec.path_outside_team", **overrides: Any) -> dict[str, Any]:
        """Submitting is refused naming `field` with `code` and a hint; so is the dry run."""
        r = self.submit(**overrides)
        assert r.status_code == 422, r.text
        found = [i for i in r.json()["error"]["details"]["issues"] if i["field"] == field]
        assert [i["code"] for i in found] == [code], r.text
        assert found[0]["hint"]
        dry = self.validate(**overrides)
        assert not dry["valid"] and [e["code"] for e in dry["errors"] if e["field"] == field] == [code], dry
        return found[0]


@pytest.fixture
def t(api, tmp_path_factory: pytest.TempPathFactory) -> Teams:  # type: ignore[no-untyped-def]
    return Teams(api, tmp_path_factory.mktemp("outside"))


def test_the_escapes_of_the_issue_are_refused_at_submission(t: Teams) -> None:
    b_dir = t.b_job["output_dir"]
    t.refused(
        "hf-checkpoint", "spec.missing_input", **{"hf-checkpoint": f"artifacts://jobs/{t.b_job['id']}/hf"}
    )
    t.refused("hf-checkpoint", "spec.unknown_job_reference", **{"hf-checkpoint": f"job://{t.b_job['id']}/hf"})
    t.refused("hf-checkpoint", "spec.unknown_job_reference", **{"hf-checkpoint": "job://b-sft/hf"})
    assert "artifact store" in t.refused("save-hf", **{"save-hf": b_dir})["message"]
    t.refused("save", **{"save": f"{b_dir}/ckpt"})
    assert (
        "platform's home" in t.refused("prompt-data", **{"prompt-data": str(t.home / "admin.key")})["message"]
    )
    t.refused("save-hf", **{"save-hf": str(t.home)})
    t.refused("save-hf", **{"save-hf": str(t.settings.artifacts)})
    t.refused(
        "prompt-data", "spec.bad_path", **{"prompt-data": "artifacts://../" + t.b + "/data/train.jsonl"}
    )
    (t.settings.artifacts / "teams" / t.a / "data" / "key.jsonl").symlink_to(t.home / "admin.key")
    assert (
        "symbolic link"
        in t.refused("prompt-data", **{"prompt-data": "artifacts://data/key.jsonl"})["message"]
    )
    t.refused("prompt-data", **{"prompt-data": str(t.outside / "x.jsonl")})
    t.refused("prompt-data", "spec.unsupported_scheme", **{"prompt-data": "s3://bucket/x.jsonl"})
    t.refused("prompt-data", "spec.bad_path", **{"prompt-data": ""})
    assert [j["id"] for j in t.client.get("/v1/jobs").json()["data"]] == [t.b_job["id"]]  # nothing stored
    assert sorted(p.name for p in Path(b_dir).iterdir()) == ["hf"]  # and nothing written at B's


def test_a_team_reads_and_writes_its_own_area_and_jobs(t: Teams) -> None:
    r = t.submit(save="ckpt", **{"save-hf": "artifacts://models/a-sft"})
    assert r.status_code == 201, r.text
    job = r.json()
    area = t.settings.artifacts / "teams" / t.a
    assert job["output_dir"] == str(area / "jobs" / job["id"])
    assert job["spec"]["hf_checkpoint"] == str(area / "models" / "tiny")
    assert job["spec"]["save"] == str(area / "jobs" / job["id"] / "ckpt")
    Path(job["output_dir"], "hf").mkdir(parents=True)
    again = t.submit(
        **{"hf-checkpoint": f"job://{job['id']}/hf", "ref-load": str(Path(job["output_dir"], "hf"))}
    )
    assert again.status_code == 201, again.text
    assert again.json()["submitted"]["inputs"] == [
        {"field": "hf-checkpoint", "job_id": job["id"], "path": str(Path(job["output_dir"], "hf"))}
    ]
    hub = t.validate(**{"hf-checkpoint": "Qwen/Qwen3-4B"})
    assert hub["valid"] and hub["spec"]["hf_checkpoint"] == "Qwen/Qwen3-4B"
    storage = t.client.get("/v1/storage", headers=_as(t.a_key)).json()
    assert storage["team"] == t.a and storage["area"] == str(area) and storage["grants"] == []
    assert t.client.get("/v1/storage", params={"team": "beta"}, headers=_as(t.a_key)).status_code == 403


def test_grants_crud_and_what_they_open(t: Teams) -> None:
    data, scratch = t.outside / "datasets", t.outside / "scratch"
    data.mkdir()
    scratch.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    c = t.client
    t.refused("prompt-data", **{"prompt-data": str(data / "train.jsonl")})

    # only admins see and change grants
    assert c.get("/v1/admin/path-grants", headers=_as(t.a_key)).status_code == 403
    body = {"team": "alpha", "path": str(data), "mode": "ro"}
    assert c.post("/v1/admin/path-grants", json=body, headers=_as(t.a_key)).status_code == 403

    r = c.post("/v1/admin/path-grants", json=body)
    assert r.status_code == 201, r.text
    ro = r.json()
    assert (ro["team_id"], ro["pool"], ro["path"], ro["mode"]) == (t.a, None, str(data), "ro")
    assert c.post("/v1/admin/path-grants", json=body).json()["error"]["code"] == "path_grant.exists"
    ok = t.submit(**{"prompt-data": str(data / "train.jsonl")})
    assert ok.status_code == 201, ok.text
    r_b = t.submit(t.b_key, **{"prompt-data": str(data / "train.jsonl")})
    assert r_b.status_code == 422  # a grant is per team
    assert "read-only" in t.refused("save-hf", **{"save-hf": str(data / "hf")})["message"]

    # read-write, in one pool only
    r = c.post(
        "/v1/admin/path-grants", json={"team": t.a, "path": str(scratch), "mode": "rw", "pool": "local"}
    )
    assert r.status_code == 201, r.text
    rw = r.json()
    out = t.submit(**{"save-hf": str(scratch / "hf")})
    assert out.status_code == 201, out.text
    assert {g["id"] for g in c.get("/v1/admin/path-grants", params={"team": "alpha"}).json()["data"]} == {
        ro["id"],
        rw["id"],
    }
    assert c.get("/v1/admin/path-grants", params={"team": "beta"}).json()["data"] == []
    storage = c.get("/v1/storage", headers=_as(t.a_key)).json()
    assert {g["path"] for g in storage["grants"]} == {str(data), str(scratch)}

    # the driver gets the roots with its spec, and checks them again there
    with c.app.state.db.session(read_only=True) as s:
        reports = JobReports(s, artifact_root=t.settings.artifacts, home=t.home)
        policy = reports.driver_spec(s.get(Job, out.json()["id"]))["platform_paths"]
    assert policy["job_id"] == out.json()["id"]
    assert (
        str(scratch) in policy["write"] and str(data) in policy["read"] and str(data) not in policy["write"]
    )
    assert policy["deny"] == [str(t.home.resolve()), str(t.settings.artifacts)]

    # removed: refused again
    assert c.delete(f"/v1/admin/path-grants/{ro['id']}").status_code == 200
    assert c.delete(f"/v1/admin/path-grants/{ro['id']}").status_code == 404
    t.refused("prompt-data", **{"prompt-data": str(data / "train.jsonl")})


# (path, answer, error code) of grants that would open the platform's own files or are not paths at all
REFUSED_GRANTS = [
    ("relative/data", 422, "path_grant.invalid"),
    ("/", 422, "path_grant.invalid"),
    ("", 422, "path_grant.invalid"),
    ("{home}", 422, "path_grant.protected"),
    ("{home}/admin.key", 422, "path_grant.protected"),
    ("{home}/..", 422, "path_grant.protected"),
    ("{artifacts}/teams/{b}", 422, "path_grant.protected"),
]


def test_grants_that_would_open_the_platform_are_refused(t: Teams, subtests) -> None:  # type: ignore[no-untyped-def]
    """Each of REFUSED_GRANTS a subtest, one after another on one platform: a refusal stores nothing, so each
    finds (and leaves) no grant at all."""
    for path, status, code in REFUSED_GRANTS:
        with subtests.test(path=path):
            raw = path.format(home=t.home, artifacts=t.settings.artifacts, b=t.b)
            r = t.client.post("/v1/admin/path-grants", json={"team": "alpha", "path": raw, "mode": "ro"})
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code
            assert t.client.get("/v1/admin/path-grants").json()["data"] == []


def test_grants_name_a_known_team_pool_and_mode(t: Teams) -> None:
    c, path = t.client, str(t.outside)
    assert (
        c.post("/v1/admin/path-grants", json={"team": "nope", "path": path, "mode": "ro"}).status_code == 404
    )
    r = c.post("/v1/admin/path-grants", json={"team": "alpha", "path": path, "mode": "ro", "pool": "nope"})
    assert r.status_code == 404
    assert (
        c.post("/v1/admin/path-grants", json={"team": "alpha", "path": path, "mode": "rwx"}).status_code
        == 422
    )
    # a grant in another pool does not apply to this pool's jobs
    c.post("/v1/pools", json={"name": "gpu", "accelerator": "h200", "nodes": []})
    r = c.post("/v1/admin/path-grants", json={"team": "alpha", "path": path, "mode": "ro", "pool": "gpu"})
    assert r.status_code == 201, r.text
    t.refused("prompt-data", **{"prompt-data": f"{path}/x.jsonl"})


def test_relaxctl_admin_grants_and_models_tiny(t: Teams, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    import client.cli as cli
    import client.commands as commands
    import runtime.data.arith as arith
    import runtime.models.tiny as tiny
    from client.sdk import RelaxClient

    def sdk(url, key):  # type: ignore[no-untyped-def]
        c = RelaxClient("http://testserver", "unused")
        c._http = t.client
        c.close = lambda: None  # type: ignore[method-assign]
        return c

    monkeypatch.setattr(commands, "connect", sdk)
    run = CliRunner().invoke
    r = run(cli.app, ["admin", "grants", "add", "alpha", str(t.outside), "--mode", "rw"])
    assert r.exit_code == 0, r.output
    grant_id = r.output.split()[0]
    r = run(cli.app, ["admin", "grants", "list", "--json"])
    assert r.exit_code == 0 and [g["id"] for g in json.loads(r.output)] == [grant_id]
    r = run(cli.app, ["admin", "grants", "add", "alpha", str(t.home)])
    assert r.exit_code == 2 and "path_grant.protected" in r.output
    r = run(cli.app, ["admin", "grants", "remove", grant_id])
    assert r.exit_code == 0 and grant_id in r.output

    # `relaxctl models tiny` writes into the caller's team area (here the admin's: team default)
    written: list[Path] = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda out, seed=0: written.append(Path(out)) or Path(out))
    monkeypatch.setattr(arith, "write_datasets", lambda out: written.append(Path(out)) or {})
    r = run(cli.app, ["models", "tiny", "--team", "beta"])
    assert r.exit_code == 0, r.output
    area = t.settings.artifacts / "teams" / t.b
    assert written == [area / "models" / "tiny", area / "datasets" / "arith"]


def test_an_autoscaler_config_in_the_area_makes_the_rollout_elastic_at_submission_and_in_the_dry_run(
    t: Teams,
) -> None:
    """`--autoscaler-config` names a YAML in the team's area: the job's stored demand has an elastic rollout
    group with the YAML's bounds (what the scheduling pass reads), and the dry run shows it; bounds that do
    not hold the engines the spec asks for are refused in both, naming the field; a YAML outside the team's
    area is refused as any path is."""
    area = t.settings.artifacts / "teams" / t.a
    (area / "scale.yaml").write_text("min_engines: 1\nmax_engines: 3\n")
    (area / "narrow.yaml").write_text("min_engines: 2\nmax_engines: 3\n")
    elastic = {"colocate": False, "autoscaler-config": "artifacts://scale.yaml"}

    def rollout(demand: dict[str, Any]) -> dict[str, Any]:
        (group,) = [g for g in demand["groups"] if g["role"] == "rollout"]
        return group

    r = t.submit(**elastic)
    assert r.status_code == 201, r.text
    assert (rollout(r.json()["demand"])["min_replicas"], rollout(r.json()["demand"])["max_replicas"]) == (
        1,
        3,
    )
    dry = t.validate(**elastic)
    assert dry["valid"], dry
    assert (rollout(dry["demand"])["min_replicas"], rollout(dry["demand"])["max_replicas"]) == (1, 3)
    plain = t.submit(colocate=False)
    assert plain.status_code == 201, plain.text
    assert rollout(plain.json()["demand"]).get("min_replicas") is None

    narrow = elastic | {"autoscaler-config": "artifacts://narrow.yaml"}  # 2..3 engines, the spec asks for 1
    assert "engine" in t.refused("autoscaler-config", code="spec.invalid_value", **narrow)["message"]
    t.refused("autoscaler-config", **elastic | {"autoscaler-config": f"{t.b_job['output_dir']}/x.yaml"})
