"""What a platform job may open, checked again on the cluster, and which folders a job owns.

The platform resolves every path of a spec at submission (scheduler/services/paths.py): each lies in the
submitting team's area, a `job://` output of the team, or a location an admin granted the team; the platform's
home never. It hands the driver, with the resolved spec, the roots the job may read and write under
`PATHS_KEY`. The driver runs as the platform's OS user, so it checks again before it opens anything
(`PathPolicy.check_spec`, and each eval-config dataset): a path that is not one the platform resolved, or that
a symbolic link now leads elsewhere, is refused. Standalone runs (`--spec-file`) carry no policy: they are the
user's own.

Exports and checkpoints mark the folders they create with `OWNER_FILE` (the job id; `LOCAL_OWNER` for
standalone runs): `runtime.train.checkpoint.atomic_directory` replaces a folder only when this same job wrote
it, and retention only deletes its own checkpoints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.spec import RuntimeSpec

PATHS_KEY = "platform_paths"  # key of the driver's spec that carries the job's PathPolicy
OWNER_FILE = ".relax-job"  # inside every folder an export or a checkpoint created: the id of its job
LOCAL_OWNER = "local"  # the owner written by standalone runs
ROLLOUT_TEMPLATE = "{rollout_id}"  # stands for the step in `save-hf` and the debug-data paths

# A Hugging Face hub model id (`Org/Name`): accepted in `hf-checkpoint` only, and never as a path.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")

# Path parameters the runtime opens: input (read) or output (written); `eval_prompt_data` holds name/path
# pairs. Kept equal to jobspec's path fields among RuntimeSpec's by a test.
RUNTIME_PATH_FIELDS: dict[str, str] = {
    "hf_checkpoint": "input",
    "ref_load": "input",
    "load": "input",
    "critic_load": "input",
    "opd_teacher_load": "input",
    "prompt_data": "input",
    "eval_prompt_data": "input",
    "eval_config": "input",
    "load_debug_rollout_data": "input",
    "save": "output",
    "save_hf": "output",
    "critic_save": "output",
    "save_debug_rollout_data": "output",
    "save_debug_train_data": "output",
}


class PathRefused(PermissionError):
    """A path the job may not open."""


def is_hub_id(value: str) -> bool:
    return bool(HUB_ID.match(value)) and ".." not in value


def within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _roots(values: Iterable[str]) -> tuple[Path, ...]:
    return tuple(Path(v) for v in values)


@dataclass(frozen=True)
class PathPolicy:
    """The roots a platform job may read and write (absolute, symlink-free, as the platform resolved them).

    `deny` (the platform home, the artifact store) is never reachable except through `managed` roots, the
    folders the platform itself allots (the team's area, the outputs of the team's jobs); a granted root that
    overlaps a denied one does not open it."""

    job_id: str
    read: tuple[Path, ...]
    write: tuple[Path, ...]
    managed: tuple[Path, ...]
    deny: tuple[Path, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "read": [str(p) for p in self.read],
            "write": [str(p) for p in self.write],
            "managed": [str(p) for p in self.managed],
            "deny": [str(p) for p in self.deny],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PathPolicy:
        return cls(
            job_id=str(data["job_id"]),
            read=_roots(data.get("read", ())),
            write=_roots(data.get("write", ())),
            managed=_roots(data.get("managed", ())),
            deny=_roots(data.get("deny", ())),
        )

    @classmethod
    def of(cls, spec: RuntimeSpec) -> PathPolicy | None:
        """The policy the platform sent with the spec; None for a standalone run."""
        data = spec.extra.get(PATHS_KEY)
        return cls.from_dict(data) if isinstance(data, Mapping) else None

    # -- checks ---------------------------------------------------------------------------------------------
    def check(self, value: str, *, write: bool, what: str) -> Path:
        """The path `value` names, or PathRefused: absolute, no symbolic link on the way (the platform resolved
        them all: one there now was put there since), inside a readable (or, with `write`, writable) root
        and, unless inside a platform-managed root, outside the platform's home and artifact store."""
        if not isinstance(value, str) or not value or "\x00" in value:
            raise PathRefused(f"{what}: {value!r} is not a path")
        if not os.path.isabs(value):
            raise PathRefused(f"{what}: {value!r} is not an absolute path (the platform resolves every path)")
        lexical = Path(os.path.normpath(value))
        real = Path(os.path.realpath(value))
        if real != lexical:
            raise PathRefused(
                f"{what}: {value} leads through a symbolic link (to {real}); refusing to follow it"
            )
        roots = self.write if write else self.read
        if not any(within(real, root) for root in roots):
            raise PathRefused(
                f"{what}: {value} is outside what this job may {'write' if write else 'read'} "
                "(its team's area, its team's job outputs and the team's grants)"
            )
        if any(within(real, d) for d in self.deny) and not any(within(real, m) for m in self.managed):
            raise PathRefused(f"{what}: {value} is inside the platform's own storage")
        return real

    def check_hub_id(self, value: str, *, what: str) -> None:
        """A hub id is fetched from the hub, never opened as a path: refuse one that is also a local path."""
        if os.path.lexists(value):
            raise PathRefused(
                f"{what}: {value!r} is a hub id that also names a local path ({os.path.abspath(value)})"
            )

    def check_spec(self, spec: RuntimeSpec) -> None:
        """Every path parameter the runtime opens."""
        for name, kind in RUNTIME_PATH_FIELDS.items():
            value = getattr(spec, name, None)
            what = "--" + name.replace("_", "-")
            if value is None:
                continue
            if name == "eval_prompt_data":
                items = value.split() if isinstance(value, str) else list(value)
                for path in items[1::2]:
                    self.check(str(path), write=False, what=what)
                continue
            if (
                name == "hf_checkpoint"
                and isinstance(value, str)
                and not os.path.isabs(value)
                and is_hub_id(value)
            ):
                self.check_hub_id(value, what=what)
                continue
            self.check(str(value), write=kind == "output", what=what)

    def check_eval_datasets(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """The dataset paths an `eval-config` file names (the platform only saw the file)."""
        for entry in entries:
            self.check(
                str(entry.get("path")), write=False, what=f"--eval-config dataset {entry.get('name')!r}"
            )


def owner_of(spec: RuntimeSpec) -> str:
    """Who this run writes into the folders it creates: the platform job's id, else `LOCAL_OWNER`."""
    policy = PathPolicy.of(spec)
    return policy.job_id if policy is not None else LOCAL_OWNER


def check_paths(spec: RuntimeSpec) -> PathPolicy | None:
    """The driver's check before it opens anything (a no-op for standalone runs)."""
    policy = PathPolicy.of(spec)
    if policy is not None:
        policy.check_spec(spec)
    return policy
