"""`--warm-hf-checkpoint-page-cache` (runtime/models/page_cache.py): a checkpoint folder is streamed once per
node — the first caller reads every byte, later callers (other roles' processes) read nothing — and read again
once its files change; the job's role plan names the folders its roles warm."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from runtime.models.page_cache import WARM_ENV, warm_from_env, warm_page_cache


def _checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "hf"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "tokenizer.json").write_text("x" * 1000)
    return folder


def test_a_folder_is_streamed_once_per_node_and_again_when_it_changes(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    markers = tmp_path / "node"
    assert warm_page_cache(folder, marker_dir=markers) == size
    assert warm_page_cache(folder, marker_dir=markers) == 0  # another role on the node: already warm
    assert warm_page_cache(folder, marker_dir=tmp_path / "other-node") == size
    (folder / "config.json").write_text('{"changed": true}')
    assert warm_page_cache(folder, marker_dir=markers) == size + len('{"changed": true}') - 2
    assert warm_page_cache(tmp_path / "missing", marker_dir=markers) == 0  # not a local folder: nothing


def _warm_in_child(env: dict[str, str], out: multiprocessing.Queue[int]) -> None:
    os.environ.update(env)
    out.put(warm_from_env())


def test_concurrent_roles_read_it_once(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    env = {WARM_ENV: str(folder), "RELAX_PAGE_CACHE_DIR": str(tmp_path / "node")}
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_warm_in_child, args=(env, out)) for _ in range(3)]
    for p in procs:
        p.start()
    read = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert read == [0, 0, size]


def test_the_role_plan_names_the_folders_to_warm(tmp_path: Path) -> None:
    from runtime.pipeline import role_plan
    from runtime.spec import load_spec

    base = {
        "train-backend": "torch",
        "hf-checkpoint": str(tmp_path / "policy"),
        "ref-load": str(tmp_path / "policy"),
        "prompt-data": "unused.jsonl",
        "rollout-batch-size": 4,
        "num-rollout": 1,
        "rm-type": "math",
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
    }
    (tmp_path / "policy").mkdir()
    assert role_plan(load_spec(base), 1).warm_page_cache == ()
    plan = role_plan(load_spec({**base, "warm-hf-checkpoint-page-cache": True}), 1)
    assert plan.warm_page_cache == (str(tmp_path / "policy"),)
