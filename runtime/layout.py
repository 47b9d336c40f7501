"""The Relax checkpoint layout as it is read: `<save>/iter_NNNNNNN/` folders (each carrying its job's
`.relax-job` mark and, when complete, its state file) and `latest_checkpointed_iteration.txt`.

Pure file-system reads, shared by the runtime (resume: `latest_complete_iteration`) and the platform
(reconciling a job's checkpoint records with its files: scheduler/services/reports.py). Writing lives in
`runtime/train/checkpoint.py`.
"""

from __future__ import annotations

from pathlib import Path

from runtime.access import OWNER_FILE

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_STATE_FILE = "trainer_state.json"  # in every policy checkpoint (torch and megatron layouts)


def iteration_dir(root: str | Path, iteration: int) -> Path:
    """`<root>/iter_0000005`: seven digits, as Megatron and Relax name them."""
    return Path(root) / f"iter_{iteration:07d}"


def read_latest_iteration(root: str | Path) -> int | None:
    """The iteration recorded in `<root>/latest_checkpointed_iteration.txt`, or None when there is none."""
    path = Path(root) / LATEST_FILE
    if not path.is_file():
        return None
    text = path.read_text().strip()
    return int(text) if text.isdigit() else None


def directory_size(path: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def folder_owner(folder: str | Path) -> str | None:
    """The job that wrote `folder` (its `OWNER_FILE`), or None: not a folder an export or checkpoint made."""
    marker = Path(folder) / OWNER_FILE
    if marker.is_symlink() or not marker.is_file():
        return None
    return marker.read_text(encoding="utf-8", errors="replace").strip() or None


def list_iterations(root: str | Path) -> list[int]:
    """The iterations with a (complete) `iter_NNNNNNN` folder under `root`, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        name = child.name
        if child.is_dir() and name.startswith("iter_") and len(name) == 12 and name[5:].isdigit():
            found.append(int(name[5:]))
    return sorted(found)


def is_complete_checkpoint(folder: str | Path, *, state_file: str = TRAINER_STATE_FILE) -> bool:
    """An `iter_NNNNNNN` folder that holds a whole checkpoint: written into a scratch folder and renamed
    into place (`atomic_directory`), so its state file is there; retention renames a folder away before
    deleting it, so a half-deleted one never carries the name either."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and (folder / state_file).is_file()


def latest_complete_iteration(root: str | Path, *, state_file: str = TRAINER_STATE_FILE) -> int | None:
    """The iteration to resume from: the newest complete checkpoint on disk under `root`.

    `latest_checkpointed_iteration.txt` is written after the folder is renamed into place, so a crash
    between the two leaves it one checkpoint behind, and a folder it names may have been deleted since;
    the folders are the truth. Without any complete folder, what the tracker says (None without one): a
    layout without that state file, or a tracker naming a folder that is gone, which loading then reports
    instead of silently starting over."""
    complete = [
        i
        for i in list_iterations(root)
        if is_complete_checkpoint(iteration_dir(root, i), state_file=state_file)
    ]
    if complete:
        return max(complete)
    return read_latest_iteration(root)
