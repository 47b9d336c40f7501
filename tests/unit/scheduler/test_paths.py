"""Path resolution keeps each team inside its area, its jobs' outputs and its grants (scheduler/services/paths.py).

One test per escape of the issue: another team's job through artifacts:// or job://, another team's output
folder as an output, the platform's home as an input or an output, `..`, symbolic links out, absolute paths
outside grants, hub ids, and malformed values."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import jobspec
from runtime.access import within
from scheduler.domain.errors import InvalidRequest
from scheduler.services.grants import normalize_grant_path
from scheduler.services.paths import (
    Grant,
    Producer,
    Resolution,
    TeamStorage,
    _within,
    real,
    real_under,
    resolve_spec_paths,
)
from tests.factories import grpo_spec


class World:
    """A platform home with its artifact store, two teams with an area each, and storage outside both."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.store = self.home / "artifacts"
        self.shared_ro = root / "shared" / "datasets"
        self.shared_rw = root / "shared" / "scratch"
        self.elsewhere = root / "elsewhere"
        for d in (self.shared_ro, self.shared_rw, self.elsewhere):
            d.mkdir(parents=True)
        (self.shared_ro / "train.jsonl").write_text("{}\n")
        (self.elsewhere / "secret.jsonl").write_text("{}\n")
        self.home.mkdir(exist_ok=True)
        (self.home / "admin.key").write_text("rlx_secret\n")
        (self.home / "relax.db").write_text("")
        self.a = self.storage("team_a", grants=(Grant(self.shared_ro, "ro"), Grant(self.shared_rw, "rw")))
        self.b = self.storage("team_b")
        for area in (self.a.area, self.b.area):
            (area / "models" / "tiny").mkdir(parents=True)
            (area / "datasets").mkdir()
            (area / "datasets" / "train.jsonl").write_text("{}\n")
        self.b_job = self.b.job_dir("job_b")
        (self.b_job / "hf").mkdir(parents=True)
        self.a_job = self.a.job_dir("job_a")
        (self.a_job / "hf").mkdir(parents=True)
        self.a_jobs = {"job_a": Producer("job_a", self.a_job), "sft": Producer("job_a", self.a_job)}

    def storage(self, team: str, grants: tuple[Grant, ...] = ()) -> TeamStorage:
        return TeamStorage(
            home=self.home,
            artifact_root=self.store,
            team_id=team,
            team_name=team,
            pool="local",
            grants=grants,
        )

    def resolve(self, storage: TeamStorage | None = None, **overrides: Any) -> Resolution:
        """Resolve a small valid spec of team A (B's jobs are not A's producers) with `overrides`."""
        base = {"hf-checkpoint": "artifacts://models/tiny", "prompt-data": "artifacts://datasets/train.jsonl"}
        spec = jobspec.normalize(obj=grpo_spec(**{**base, **overrides})).spec.to_dict()
        storage = storage or self.a
        jobs = self.a_jobs if storage is self.a else {}
        return resolve_spec_paths(
            spec, storage=storage, job_dir=storage.job_dir("job_new"), find_producer=jobs.get
        )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def issues(res: Resolution) -> list[tuple[str, str]]:
    return [(i.code, i.field) for i in res.issues]


def refused(res: Resolution, field: str, code: str = "spec.path_outside_team") -> str:
    found = [i for i in res.issues if i.field == field]
    assert [i.code for i in found] == [code], issues(res)
    assert found[0].hint, "every refusal comes with a hint"
    return found[0].message


# -- what resolves ---------------------------------------------------------------------------------------------
def test_artifacts_job_and_relative_outputs_resolve_inside_the_team(w: World) -> None:
    res = w.resolve(**{"ref-load": "job://sft/hf", "save": "ckpt", "save-hf": "artifacts://models/mine"})
    assert issues(res) == []
    assert res.spec["hf_checkpoint"] == str(w.a.area / "models" / "tiny")
    assert res.spec["prompt_data"] == str(w.a.area / "datasets" / "train.jsonl")
    assert res.spec["ref_load"] == str(w.a_job / "hf")
    assert res.spec["save"] == str(w.a.job_dir("job_new") / "ckpt")
    assert res.spec["save_hf"] == str(w.a.area / "models" / "mine")
    assert res.inputs == [{"field": "ref-load", "job_id": "job_a", "path": str(w.a_job / "hf")}]


def test_a_team_area_lies_under_the_artifact_store_by_team_id(w: World) -> None:
    assert w.a.area == w.store.resolve() / "teams" / "team_a"
    assert w.a.job_dir("job_x") == w.a.area / "jobs" / "job_x"


def test_grants_open_what_they_say_and_no_more(w: World) -> None:
    ok = w.resolve(**{"prompt-data": str(w.shared_ro / "train.jsonl"), "save-hf": str(w.shared_rw / "hf")})
    assert issues(ok) == []
    assert ok.spec["save_hf"] == str(w.shared_rw / "hf")
    ro = w.resolve(**{"save-hf": str(w.shared_ro / "hf")})
    assert "read-only grant" in refused(ro, "save-hf")
    assert "outside your team's area and its grants" in refused(
        w.resolve(**{"prompt-data": str(w.elsewhere / "secret.jsonl")}), "prompt-data"
    )
    # B has no grant at all
    assert refused(w.resolve(w.b, **{"prompt-data": str(w.shared_ro / "train.jsonl")}), "prompt-data")


# -- the escapes of the issue ----------------------------------------------------------------------------------
def test_artifacts_of_another_teams_job_stay_in_the_own_area(w: World) -> None:
    res = w.resolve(**{"hf-checkpoint": "artifacts://jobs/job_b/hf"})
    message = refused(res, "hf-checkpoint", "spec.missing_input")
    assert str(w.a.area / "jobs" / "job_b" / "hf") in message  # looked in A's area, not at B's job
    assert str(w.b_job) not in res.spec["hf_checkpoint"]
    # and as an output it writes into A's area, never B's folder
    out = w.resolve(**{"save-hf": "artifacts://jobs/job_b/hf2"})
    assert issues(out) == [] and out.spec["save_hf"] == str(w.a.area / "jobs" / "job_b" / "hf2")


def test_job_reference_to_another_teams_job_is_unknown(w: World) -> None:
    res = w.resolve(**{"hf-checkpoint": "job://job_b/hf"})
    refused(res, "hf-checkpoint", "spec.unknown_job_reference")


def test_another_teams_output_folder_is_refused_as_an_output(w: World) -> None:
    for field in ("save-hf", "save", "save-debug-rollout-data"):
        res = w.resolve(**{field: str(w.b_job)})
        assert "artifact store outside your team's area" in refused(res, field)
    res = w.resolve(**{"save-hf": str(w.b_job / "hf" / "new")})
    refused(res, "save-hf")


def test_the_platform_home_is_never_an_input(w: World) -> None:
    res = w.resolve(**{"prompt-data": str(w.home / "admin.key")})
    assert "platform's home" in refused(res, "prompt-data")
    res = w.resolve(**{"eval-prompt-data": ["keys", str(w.home / "admin.key")]})
    refused(res, "eval-prompt-data")


def test_the_platform_home_is_never_an_output(w: World) -> None:
    for target in (w.home, w.home / "logs", w.root, w.store, w.store / "teams"):
        res = w.resolve(**{"save-hf": str(target)})
        refused(res, "save-hf")


def test_a_broad_grant_does_not_open_the_home_nor_other_areas(w: World) -> None:
    broad = w.storage("team_a", grants=(Grant(w.root, "rw"),))  # as if granted before the home moved in
    assert issues(w.resolve(broad, **{"prompt-data": str(w.elsewhere / "secret.jsonl")})) == []
    for target in (w.home / "admin.key", w.b.area / "datasets" / "train.jsonl"):
        refused(w.resolve(broad, **{"prompt-data": str(target)}), "prompt-data")
    refused(w.resolve(broad, **{"save-hf": str(w.home)}), "save-hf")


def test_dot_dot_is_refused_or_resolved_before_the_check(w: World) -> None:
    refused(
        w.resolve(**{"prompt-data": "artifacts://../team_b/datasets/train.jsonl"}),
        "prompt-data",
        "spec.bad_path",
    )
    refused(w.resolve(**{"hf-checkpoint": "job://sft/../../../team_b"}), "hf-checkpoint", "spec.bad_path")
    refused(w.resolve(**{"save-hf": "../../job_b/hf"}), "save-hf", "spec.bad_path")
    sneaky = f"{w.a.area}/../team_b/datasets/train.jsonl"
    refused(w.resolve(**{"prompt-data": sneaky}), "prompt-data")
    inside = f"{w.a.area}/models/../datasets/train.jsonl"
    res = w.resolve(**{"prompt-data": inside})
    assert issues(res) == [] and res.spec["prompt_data"] == str(w.a.area / "datasets" / "train.jsonl")


def test_symlinks_are_resolved_and_a_link_out_is_refused(w: World) -> None:
    (w.a.area / "datasets" / "key.jsonl").symlink_to(w.home / "admin.key")
    (w.a.area / "b-data").symlink_to(w.b.area / "datasets")
    (w.a.area / "models" / "b-job").symlink_to(w.b_job)
    (w.a.area / "shared").symlink_to(w.shared_ro)
    message = refused(w.resolve(**{"prompt-data": "artifacts://datasets/key.jsonl"}), "prompt-data")
    assert "symbolic link" in message
    refused(w.resolve(**{"prompt-data": "artifacts://b-data/train.jsonl"}), "prompt-data")
    refused(w.resolve(**{"save-hf": "artifacts://models/b-job/hf"}), "save-hf")
    refused(w.resolve(**{"prompt-data": str(w.a.area / "b-data" / "train.jsonl")}), "prompt-data")
    # a link to a location the team was granted resolves to it (and keeps the grant's mode)
    res = w.resolve(**{"prompt-data": "artifacts://shared/train.jsonl"})
    assert issues(res) == [] and res.spec["prompt_data"] == str(w.shared_ro / "train.jsonl")
    refused(w.resolve(**{"save-hf": "artifacts://shared/hf"}), "save-hf")


def test_a_job_folder_linked_out_is_refused(w: World) -> None:
    w.a.area.joinpath("jobs", "job_new").parent.mkdir(parents=True, exist_ok=True)
    (w.a.area / "jobs" / "job_new").symlink_to(w.home)
    refused(w.resolve(**{"save": "ckpt"}), "save")


def test_hub_ids_are_taken_by_hf_checkpoint_only_and_never_as_paths(w: World) -> None:
    (w.a.area / "Qwen" / "Qwen3-4B").mkdir(parents=True)  # a folder of the same name changes nothing
    res = w.resolve(**{"hf-checkpoint": "Qwen/Qwen3-4B"})
    assert issues(res) == [] and res.spec["hf_checkpoint"] == "Qwen/Qwen3-4B"
    assert [x.code for x in res.warnings] == ["spec.hub_id_like_area_path"]  # says so, and how to mean it
    assert w.resolve(**{"hf-checkpoint": "Org/Other"}).warnings == []
    for field in ("ref-load", "prompt-data"):
        refused(w.resolve(**{field: "Qwen/Qwen3-4B"}), field, "spec.relative_input")
    for not_hub in ("../x/y", "a/b/c", ".hidden/model", "Org/..", "models"):
        refused(w.resolve(**{"hf-checkpoint": not_hub}), "hf-checkpoint", "spec.relative_input")


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("", "spec.bad_path"),
        ("   ", "spec.bad_path"),
        ("/data/a\x00b", "spec.bad_path"),
        ("artifacts://datasets/a\x00b", "spec.bad_path"),
        ("/" + "é" * 3000, "spec.bad_path"),  # within PATH_MAX characters, beyond it in bytes
        ("/data/" + "b" * 300 + "/x", "spec.bad_path"),
        ("~/data.jsonl", "spec.bad_path"),
        ("~team_b/data.jsonl", "spec.bad_path"),
        ("s3://bucket/data.jsonl", "spec.unsupported_scheme"),
        ("hf://Qwen/Qwen3-4B", "spec.unsupported_scheme"),
        ("file:///etc/passwd", "spec.unsupported_scheme"),
        ("data.jsonl", "spec.relative_input"),
    ],
)
def test_malformed_values_are_refused_with_the_field_named(w: World, value: str, code: str) -> None:
    refused(w.resolve(**{"prompt-data": value}), "prompt-data", code)


def test_a_path_beyond_path_max_is_refused_by_jobspec_and_by_the_resolver(w: World) -> None:
    """jobspec refuses it first, with the resolver's code; the resolver does not rely on it."""
    long = "/" + "a" * 5000
    with pytest.raises(jobspec.SpecError) as err:
        w.resolve(**{"prompt-data": long})
    assert [(i.code, i.field) for i in err.value.errors] == [("spec.bad_path", "prompt-data")]
    res = resolve_spec_paths(
        {"prompt_data": long}, storage=w.a, job_dir=w.a.job_dir("job_new"), find_producer=w.a_jobs.get
    )
    assert "4096 bytes" in refused(res, "prompt-data", "spec.bad_path")


def test_malformed_outputs_are_refused(w: World) -> None:
    for value, code in (("", "spec.bad_path"), (".", "spec.bad_path"), ("a\x00", "spec.bad_path")):
        refused(w.resolve(**{"save-hf": value}), "save-hf", code)
    refused(w.resolve(**{"save-hf": "artifacts://"}), "save-hf", "spec.bad_path")


def test_eval_prompt_data_pairs_check_each_path_and_leave_names(w: World) -> None:
    res = w.resolve(**{"eval-prompt-data": ["math/test", "artifacts://datasets/train.jsonl"]})
    assert issues(res) == []
    assert res.spec["eval_prompt_data"] == ["math/test", str(w.a.area / "datasets" / "train.jsonl")]
    refused(
        w.resolve(**{"eval-prompt-data": ["b", str(w.b.area / "datasets" / "train.jsonl")]}),
        "eval-prompt-data",
    )
    # jobspec refuses an odd count first; the resolver does not rely on it
    odd = resolve_spec_paths(
        {"eval_prompt_data": ["a", "artifacts://datasets/train.jsonl", "b"]},
        storage=w.a,
        job_dir=w.a.job_dir("job_new"),
        find_producer=w.a_jobs.get,
    )
    refused(odd, "eval-prompt-data", "spec.bad_path")


def test_eval_config_datasets_are_checked_too(w: World) -> None:
    cfg = w.a.area / "eval.yaml"
    cfg.write_text(
        f"eval:\n  datasets:\n    - name: ok\n      path: datasets/train.jsonl\n    - name: keys\n      path: {w.home / 'admin.key'}\n"
    )
    res = w.resolve(**{"eval-config": "artifacts://eval.yaml"})
    message = refused(res, "eval-config")
    assert "'keys'" in message and "'ok'" not in message
    cfg.write_text("eval:\n  datasets:\n    other: {path: ../team_b/datasets/train.jsonl}\n")
    assert "'other'" in refused(w.resolve(**{"eval-config": "artifacts://eval.yaml"}), "eval-config")
    cfg.write_text("eval:\n  datasets:\n    ok: {path: datasets/train.jsonl}\n")
    assert issues(w.resolve(**{"eval-config": "artifacts://eval.yaml"})) == []


def test_an_export_onto_an_existing_folder_is_refused_at_submission(w: World) -> None:
    (w.a.area / "models" / "sft").mkdir()
    refused(w.resolve(**{"save-hf": "artifacts://models/sft"}), "save-hf", "spec.output_exists")
    refused(w.resolve(**{"save-hf": "job://sft/hf"}), "save-hf", "spec.output_exists")
    # a step-templated export names folders that do not exist yet
    assert issues(w.resolve(**{"save-hf": "artifacts://models/sft-{rollout_id}"})) == []


def test_the_driver_policy_lists_the_roots_the_platform_allows(w: World) -> None:
    policy = w.a.driver_policy("job_new", [w.a_job])
    assert policy["job_id"] == "job_new"
    assert policy["read"] == [str(w.a.area), str(w.a_job), str(w.shared_ro), str(w.shared_rw)]
    assert policy["write"] == [str(w.a.area), str(w.a_job), str(w.shared_rw)]
    assert policy["deny"] == [str(w.home), str(w.store)]


# -- grants ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    ["relative/path", "", "/", "//", "/x\x00y", "~/data"],
)
def test_grant_paths_must_be_absolute_and_not_everything(w: World, raw: str) -> None:
    with pytest.raises(InvalidRequest):
        normalize_grant_path(raw, home=w.home, artifact_root=w.store)


def test_grants_never_cover_the_home_or_the_artifact_store(w: World) -> None:
    for raw in (w.home, w.home / "admin.key", w.root, w.store, w.b.area, w.a.area / "models"):
        with pytest.raises(InvalidRequest) as err:
            normalize_grant_path(str(raw), home=w.home, artifact_root=w.store)
        assert err.value.code == "path_grant.protected"
    link = w.root / "link-to-home"
    link.symlink_to(w.home)
    with pytest.raises(InvalidRequest):
        normalize_grant_path(str(link), home=w.home, artifact_root=w.store)
    assert (
        normalize_grant_path(f"{w.shared_ro}/../datasets/", home=w.home, artifact_root=w.store) == w.shared_ro
    )
    assert os.path.isabs(normalize_grant_path("/nonexistent/data", home=w.home, artifact_root=w.store))


def test_resolving_under_a_real_root_is_resolving_the_whole_path(tmp_path: Path) -> None:
    """`real_under(root, rel)` looks only at `rel`'s components (the root is real already) and gives what
    `real(root / rel)` gives: through links inside, out, relative, absolute, chained, looping and dangling,
    under a file, with '..', '.', doubled slashes; `_within` answers as `runtime.access.within`."""
    root = tmp_path / "area"
    (root / "d" / "e").mkdir(parents=True)
    (root / "f.txt").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (root / "out").symlink_to(out)  # absolute, out
    (root / "rel").symlink_to("d/e")  # relative, inside
    (root / "up").symlink_to("../out")  # relative, out
    (root / "d" / "chain").symlink_to("../rel")  # a link to a link
    (root / "loop").symlink_to("loop2")
    (root / "loop2").symlink_to("loop")
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    cases = [
        "", ".", "d", "d/e", "d/e/new/deeper", "f.txt", "f.txt/below", "missing/x", "out", "out/x", "rel/y",
        "up/z", "d/chain/w", "loop/a", "dangling/b", "d/../out", "d/./e//x/", "/etc", "rel/../f.txt",
    ]  # fmt: skip
    real_root = real(root)
    for rel in cases:
        assert real_under(real_root, rel) == real(real_root / rel), rel
    paths = [real_root, real_root / "d", out, Path("/"), Path("/x"), tmp_path, Path(str(real_root) + "x")]
    for p in paths:
        for r in paths:
            assert _within(p, r) == within(p, r), (p, r)
