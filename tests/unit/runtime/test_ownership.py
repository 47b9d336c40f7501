"""Exports replace only folders their own job wrote; the driver opens only the paths the platform resolved
(runtime/access.py, runtime/train/checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.access import OWNER_FILE, RUNTIME_PATH_FIELDS, PathPolicy, PathRefused, check_paths, owner_of
from runtime.devices import Device
from runtime.spec import RuntimeSpec
from runtime.train.checkpoint import NotOwnedError, atomic_directory, folder_owner
from runtime.train.torch_backend import TorchTrainBackend, TrainConfig


def _write(owner: str, final: Path, content: str) -> None:
    with atomic_directory(final, owner=owner) as scratch:
        (scratch / "weights").write_text(content)


def test_an_export_replaces_its_own_previous_export(tmp_path: Path) -> None:
    final = tmp_path / "hf"
    _write("job_a", final, "step 1")
    _write("job_a", final, "step 2")
    assert (final / "weights").read_text() == "step 2"
    assert folder_owner(final) == "job_a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no scratch or retired folder left


@pytest.mark.parametrize("owner", ["job_b", None])
def test_an_export_never_replaces_a_folder_it_does_not_own(tmp_path: Path, owner: str | None) -> None:
    final = tmp_path / "hf"
    final.mkdir()
    (final / "weights").write_text("someone else's")
    if owner:
        (final / OWNER_FILE).write_text(owner)
    with pytest.raises(NotOwnedError, match="refusing to replace"):
        _write("job_a", final, "mine")
    assert (final / "weights").read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_never_follows_or_replaces_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "platform-home"
    target.mkdir()
    (target / "relax.db").write_text("db")
    (target / OWNER_FILE).write_text("job_a")  # even one that claims to be the job's
    link = tmp_path / "hf"
    link.symlink_to(target)
    with pytest.raises(NotOwnedError, match="symbolic link"):
        _write("job_a", link, "mine")
    assert (target / "relax.db").read_text() == "db" and link.is_symlink()


def test_an_export_onto_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("a file")
    with pytest.raises(NotOwnedError):
        _write("job_a", tmp_path / "hf", "mine")


def test_a_folder_that_appears_while_writing_is_not_replaced(tmp_path: Path) -> None:
    final = tmp_path / "hf"
    with pytest.raises(NotOwnedError):
        with atomic_directory(final, owner="job_a") as scratch:
            (scratch / "weights").write_text("mine")
            final.mkdir()  # another job's export lands first
            (final / OWNER_FILE).write_text("job_b")
    assert folder_owner(final) == "job_b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_torch_backend_export_keeps_to_its_own_folders(tiny_model: Path, tmp_path: Path) -> None:
    backend = TorchTrainBackend(str(tiny_model), TrainConfig(owner="job_a"), device=Device.detect())
    backend.export_hf(str(tmp_path / "hf"), step=1)
    backend.export_hf(str(tmp_path / "hf"), step=2)  # its own previous export: replaced
    assert folder_owner(tmp_path / "hf") == "job_a"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / OWNER_FILE).write_text("job_b")
    with pytest.raises(NotOwnedError):
        backend.export_hf(str(other), step=3)
    assert (other / "config.json").read_text() == "{}"
    record = backend.save_checkpoint(str(tmp_path / "ckpt"), 0, {})
    assert record is not None and folder_owner(record.path) == "job_a"


# -- the driver's check ------------------------------------------------------------------------------------------
@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    area = home / "artifacts" / "teams" / "team_a"
    grant = tmp_path / "datasets"
    for d in (area / "jobs" / "job_a", grant):
        d.mkdir(parents=True)
    (home / "admin.key").write_text("secret")
    (area / "train.jsonl").write_text("{}\n")
    return {"home": home, "store": home / "artifacts", "area": area, "grant": grant, "root": tmp_path}


def _policy(r: dict[str, Path], *, grant_mode: str = "ro", extra_read: tuple[Path, ...] = ()) -> PathPolicy:
    return PathPolicy(
        job_id="job_a",
        read=(r["area"], r["grant"], *extra_read),
        write=(r["area"], *((r["grant"],) if grant_mode == "rw" else ())),
        managed=(r["area"],),
        deny=(r["home"], r["store"]),
    )


def test_policy_allows_what_the_platform_resolved(roots: dict[str, Path]) -> None:
    policy = _policy(roots)
    assert (
        policy.check(str(roots["area"] / "train.jsonl"), write=False, what="x")
        == roots["area"] / "train.jsonl"
    )
    policy.check(str(roots["area"] / "jobs" / "job_a" / "hf"), write=True, what="x")
    policy.check(str(roots["grant"] / "data.jsonl"), write=False, what="x")
    with pytest.raises(PathRefused, match="write"):
        policy.check(str(roots["grant"] / "out"), write=True, what="x")


def test_policy_refuses_the_home_whatever_the_roots(roots: dict[str, Path]) -> None:
    policy = _policy(roots, extra_read=(roots["root"],))  # as a broad grant would
    with pytest.raises(PathRefused, match="platform's own storage"):
        policy.check(str(roots["home"] / "admin.key"), write=False, what="--prompt-data")
    with pytest.raises(PathRefused):
        _policy(roots).check(str(roots["root"] / "elsewhere"), write=False, what="--prompt-data")


def test_policy_refuses_a_symlink_planted_after_submission(roots: dict[str, Path]) -> None:
    (roots["area"] / "late.jsonl").symlink_to(roots["home"] / "admin.key")
    with pytest.raises(PathRefused, match="symbolic link"):
        _policy(roots).check(str(roots["area"] / "late.jsonl"), write=False, what="--prompt-data")
    (roots["area"] / "jobs" / "job_a" / "hf").symlink_to(roots["area"])  # even one that stays inside
    with pytest.raises(PathRefused, match="symbolic link"):
        _policy(roots).check(str(roots["area"] / "jobs" / "job_a" / "hf"), write=True, what="--save-hf")


@pytest.mark.parametrize("value", ["", "relative/path.jsonl", "/x\x00y"])
def test_policy_refuses_what_is_not_an_absolute_path(roots: dict[str, Path], value: str) -> None:
    with pytest.raises(PathRefused):
        _policy(roots).check(value, write=False, what="--prompt-data")


def test_check_spec_covers_every_path_the_runtime_opens(roots: dict[str, Path], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(roots["root"])
    policy = _policy(roots)
    ok = {
        "hf_checkpoint": "Org/Model",  # a hub id
        "prompt_data": str(roots["area"] / "train.jsonl"),
        "eval_prompt_data": ["name/with/slash", str(roots["grant"] / "test.jsonl")],
        "save_hf": str(roots["area"] / "jobs" / "job_a" / "hf"),
        "platform_paths": policy.to_dict(),
    }
    spec = RuntimeSpec.from_mapping(ok)
    assert check_paths(spec) == policy and owner_of(spec) == "job_a"
    for name, value in (
        ("prompt_data", str(roots["home"] / "admin.key")),
        ("eval_prompt_data", ["keys", str(roots["home"] / "admin.key")]),
        ("save", str(roots["grant"] / "ckpt")),
        ("critic_save", str(roots["home"])),
        ("load_debug_rollout_data", str(roots["home"] / "{rollout_id}.pt")),
    ):
        with pytest.raises(PathRefused):
            check_paths(RuntimeSpec.from_mapping({**ok, name: value}))
    (roots["root"] / "Org" / "Model").mkdir(parents=True)  # a hub id that is also a local path here
    with pytest.raises(PathRefused, match="hub id"):
        check_paths(spec)
    # standalone runs carry no policy: nothing to check, and their folders are `local`'s
    bare = RuntimeSpec.from_mapping({k: v for k, v in ok.items() if k != "platform_paths"})
    assert check_paths(bare) is None and owner_of(bare) == "local"


def test_runtime_path_fields_are_the_spec_path_fields_it_reads() -> None:
    import jobspec

    read = RuntimeSpec.field_names()
    assert {n: k for n, k in jobspec.path_fields().items() if n in read} == RUNTIME_PATH_FIELDS


def test_eval_config_datasets_are_checked_when_the_file_is_read(roots: dict[str, Path]) -> None:
    policy = _policy(roots)
    policy.check_eval_datasets([{"name": "ok", "path": str(roots["area"] / "train.jsonl")}])
    with pytest.raises(PathRefused, match="'keys'"):
        policy.check_eval_datasets([{"name": "keys", "path": str(roots["home"] / "admin.key")}])
    assert os.path.exists(roots["home"] / "admin.key")
