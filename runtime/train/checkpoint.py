"""The Relax checkpoint layout on disk: `<save>/iter_NNNNNNN/` and `latest_checkpointed_iteration.txt`."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from runtime.access import LOCAL_OWNER, OWNER_FILE
from runtime.layout import (  # noqa: F401 - the layout's read side (the platform reads it too), re-exported
    LATEST_FILE,
    TRAINER_STATE_FILE,
    directory_size,
    folder_owner,
    is_complete_checkpoint,
    iteration_dir,
    latest_complete_iteration,
    list_iterations,
    read_latest_iteration,
)

ROLLOUT_ID_PLACEHOLDER = "{rollout_id}"  # allowed in `save-hf`: one HF folder per export


class CheckpointFormat(StrEnum):
    TORCH = "torch"  # an iter_NNNNNNN folder: weights + optimizer + data position; resumable with `load`
    HF = "hf"  # a Hugging Face folder (config, safetensors, tokenizer): usable as another job's hf-checkpoint


@dataclass(frozen=True)
class CheckpointRecord:
    """What the driver registers with the platform for each checkpoint written."""

    step: int
    path: str
    size_bytes: int
    format: CheckpointFormat
    time: float


def write_latest_iteration(root: str | Path, iteration: int) -> None:
    """Point `latest_checkpointed_iteration.txt` at `iteration` (atomic: a reader sees old or new)."""
    root = Path(root)
    tmp = root / f".{LATEST_FILE}.{uuid.uuid4().hex}"
    tmp.write_text(f"{iteration}\n")
    os.replace(tmp, root / LATEST_FILE)


class NotOwnedError(PermissionError):
    """A folder this job did not write is in the way: it is never replaced nor deleted."""


def check_replaceable(final: str | Path, owner: str) -> None:
    """Refuse (NotOwnedError) when `final` is a symbolic link, or exists and is not a folder `owner` wrote."""
    final = Path(final)
    if final.is_symlink():
        raise NotOwnedError(f"{final} is a symbolic link: an export never follows nor replaces one")
    if not final.exists():
        return
    found = folder_owner(final) if final.is_dir() else None
    if found != owner:
        whose = f"job {found}" if found else "no job of this platform"
        raise NotOwnedError(
            f"{final} already exists and was written by {whose}, not by this job ({owner}): refusing to "
            "replace it; write the export elsewhere (a relative path lands in the job's own folder) or "
            "remove the old one first"
        )


@contextmanager
def atomic_directory(final: str | Path, *, owner: str = LOCAL_OWNER) -> Iterator[Path]:
    """Yield a scratch folder next to `final`; on success it replaces `final` in one rename, so a crash
    mid-write never leaves a half-written checkpoint under the final name.

    The folder is marked as `owner`'s (`OWNER_FILE`), and an existing `final` is replaced only when `owner`
    wrote it: anything else in the way (another job's export, a folder no job made, a symbolic link) fails
    with NotOwnedError, before and again right before the swap."""
    final = Path(final)
    check_replaceable(final, owner)
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        yield scratch
        (scratch / OWNER_FILE).write_text(owner + "\n", encoding="utf-8")
        check_replaceable(final, owner)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if final.exists():
        retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(final, retired)
        os.replace(scratch, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(scratch, final)


def resolve_model_folder(path: str | Path, step: int | None = None) -> Path:
    """A Hugging Face model folder from either an HF folder or a checkpoint root of this layout
    (`<root>/iter_NNNNNNN/model`, the latest iteration unless `step` is given)."""
    root = Path(path)
    iteration = step if step is not None else read_latest_iteration(root)
    if iteration is None:
        return root
    folder = iteration_dir(root, iteration) / "model"
    if not folder.is_dir():
        raise FileNotFoundError(f"{root}: no model folder for iteration {iteration} ({folder})")
    return folder


def render_hf_path(save_hf: str, rollout_id: int) -> Path:
    return Path(save_hf.replace(ROLLOUT_ID_PLACEHOLDER, str(rollout_id)))


def record(path: Path, step: int, fmt: CheckpointFormat) -> CheckpointRecord:
    return CheckpointRecord(
        step=step, path=str(path), size_bytes=directory_size(path), format=fmt, time=time.time()
    )


@dataclass(frozen=True)
class RetentionPolicy:
    """Which checkpoints stay (`max-actor-ckpt-to-keep`, `rotate-ckpt`).

    Iteration r is an *interval* checkpoint when `save-interval` divides r + 1 (the saves the interval
    asks for; Relax numbering: the checkpoint after rollout r is iteration r).

    - without rotation: the newest `keep` checkpoints stay (all when `keep` is None);
    - with rotation (every step is saved): the newest checkpoint stays, plus the newest interval
      checkpoints, `keep` of them at most counting the newest itself (all when `keep` is None); the
      intermediate ones go as soon as a newer checkpoint exists.

    The newest checkpoint always stays: it is what `load` resumes from.
    """

    keep: int | None = None
    rotate: bool = False
    save_interval: int | None = None

    def is_interval(self, iteration: int) -> bool:
        return bool(self.save_interval) and (iteration + 1) % self.save_interval == 0  # type: ignore[operator]

    def to_delete(self, iterations: list[int]) -> list[int]:
        """The iterations to remove, given those on disk.

        >>> RetentionPolicy(keep=2).to_delete([1, 3, 5])
        [1]
        >>> RetentionPolicy(rotate=True, save_interval=2).to_delete([0, 1, 2, 3, 4])
        [0, 2]
        >>> RetentionPolicy(keep=1, rotate=True, save_interval=2).to_delete([0, 1, 2, 3, 4])
        [0, 1, 2]
        """
        if not iterations or (self.keep is None and not self.rotate):
            return []
        newest_first = sorted(iterations, reverse=True)
        latest = newest_first[0]
        if not self.rotate:
            keep = max(1, self.keep or 1)
            return sorted(newest_first[keep:])
        budget = None if self.keep is None else max(0, self.keep - (1 if self.is_interval(latest) else 0))
        kept_intervals = 0
        delete = []
        for iteration in newest_first[1:]:
            if self.is_interval(iteration) and (budget is None or kept_intervals < budget):
                kept_intervals += 1
            else:
                delete.append(iteration)
        return sorted(delete)


def prune_checkpoints(root: str | Path, policy: RetentionPolicy, *, owner: str = LOCAL_OWNER) -> list[Path]:
    """Remove the `iter_*` folders the policy lets go, of those `owner` wrote (another job's checkpoints in
    the same folder are never deleted); returns what was removed."""
    removed = []
    for iteration in policy.to_delete(list_iterations(root)):
        folder = iteration_dir(root, iteration)
        if folder.is_symlink() or folder_owner(folder) != owner:
            continue
        doomed = folder.parent / f".{folder.name}.del-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(folder, doomed)  # gone from the layout at once: never half-deleted under its name
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(folder)
    return removed
