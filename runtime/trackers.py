"""Experiment trackers: every metric point the driver reports (`Reporter.metrics`) also goes to TensorBoard event
files (`--use-tensorboard`, on unless `--no-use-tensorboard`) and, with `--use-wandb`, to Weights & Biases.

The platform's API stays the source of truth: the reporter delivers every point there whatever a tracker does.
A tracker that fails (no package, a full disk, W&B unreachable) says so once in the job's log and stops; it
never stops training.

Where (`tracker_plan`, pure): TensorBoard writes under `--tb-project-name` (an output path: a relative one lands
in the job's folder), else `$TENSORBOARD_DIR`, else `<job output folder>/tensorboard`, in a folder named
`--tb-experiment-name` (else the job's name), so the files are the job's artifacts
(`GET /v1/jobs/{id}/artifacts/tensorboard/<name>/<events file>`). A resumed attempt writes a new events file
whose first record tells TensorBoard to drop the points of its earlier files from the resumed step on
(`purge_step`), so a step redone after a resume is shown once. W&B: `--wandb-project` (else "relax"),
`--wandb-team` / `--wandb-entity`, `--wandb-group`, `--wandb-exp-name` (the run's name, else the job's, with a
random 6-character suffix unless `--disable-wandb-random-suffix`), `--wandb-run-id` (resumed when it exists),
`--wandb-dir` / `--wandb-save-dir` (else `<job output folder>/wandb`), `--wandb-mode` (else `$WANDB_MODE`, else
online). The API key is the cluster's `WANDB_API_KEY`, never the spec (`--wandb-key` and `--wandb-host` are
refused: a spec is readable by the whole team).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import string
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TENSORBOARD_SUBDIR = "tensorboard"
WANDB_SUBDIR = "wandb"
DEFAULT_WANDB_PROJECT = "relax"
WANDB_MODES = ("online", "offline", "disabled")
#: The W&B settings `wandb_settings` reads, besides `--use-wandb` (runtime/capabilities.py honours them).
WANDB_PARAMETERS = (
    "wandb_project",
    "wandb_team",
    "wandb_entity",
    "wandb_group",
    "wandb_exp_name",
    "wandb_run_id",
    "wandb_random_suffix",
    "wandb_dir",
    "wandb_save_dir",
    "wandb_mode",
)


def wandb_installed() -> bool:
    """Whether this process can log to W&B (the optional `wandb` extra)."""
    return importlib.util.find_spec("wandb") is not None


@dataclass(frozen=True)
class TrackerPlan:
    """What the trackers of one job write where (no I/O): `tensorboard` is the event files' folder (None: off);
    `wandb` the keyword arguments of `wandb.init` (None: off)."""

    tensorboard: Path | None = None
    wandb: dict[str, Any] | None = None
    purge_step: int | None = None  # a resumed attempt: TensorBoard drops earlier points from this step on


def _text(values: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = values.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def tracker_plan(
    values: Mapping[str, Any],
    *,
    output_dir: str | Path | None,
    run_name: str,
    start_step: int = 0,
    env: Mapping[str, str] | None = None,
    suffix: str | None = None,
) -> TrackerPlan:
    """The trackers a job's parameters ask for (`values`: the spec's, underscore names). `output_dir` is the
    job's output folder; `suffix` the random suffix of a W&B run's name (drawn when None)."""
    env = os.environ if env is None else env
    name = _text(values, "tb_experiment_name") or run_name
    tensorboard: Path | None = None
    if values.get("use_tensorboard", True):
        root = _text(values, "tb_project_name") or env.get("TENSORBOARD_DIR")
        if root is None and output_dir is not None:
            root = str(Path(output_dir) / TENSORBOARD_SUBDIR)
        tensorboard = Path(root) / name if root is not None else None
    wandb: dict[str, Any] | None = None
    if values.get("use_wandb"):
        run = _text(values, "wandb_exp_name") or run_name
        if values.get("wandb_random_suffix", True):
            alphabet = string.ascii_lowercase + string.digits
            run += "_" + (suffix or "".join(secrets.choice(alphabet) for _ in range(6)))
        directory = _text(values, "wandb_dir", "wandb_save_dir")
        if directory is None and output_dir is not None:
            directory = str(Path(output_dir) / WANDB_SUBDIR)
        mode = _text(values, "wandb_mode") or env.get("WANDB_MODE") or "online"
        wandb = {
            "project": _text(values, "wandb_project") or DEFAULT_WANDB_PROJECT,
            "entity": _text(values, "wandb_team", "wandb_entity"),
            "group": _text(values, "wandb_group"),
            "name": run,
            "id": _text(values, "wandb_run_id"),
            "resume": "allow" if _text(values, "wandb_run_id") else None,
            "dir": directory,
            "mode": mode,
        }
    return TrackerPlan(tensorboard, wandb, start_step if start_step > 0 else None)


@dataclass
class Trackers:
    """The sink the driver adds to its reporter (`Reporter.add_sink`): `scalars(step, values)` for every metric
    point, from any thread; `close()` once the run ends."""

    plan: TrackerPlan
    _tb: Any = None
    _wandb_run: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tensorboard_dir(self) -> Path | None:
        return self.plan.tensorboard if self._tb is not None else None

    def open(self) -> Trackers:
        if self.plan.tensorboard is not None:
            self._open_tensorboard(self.plan.tensorboard)
        if self.plan.wandb is not None:
            self._open_wandb(self.plan.wandb)
        return self

    def _open_tensorboard(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            log.warning(
                "--use-tensorboard: the tensorboard package is not installed on this cluster (%s); no event "
                "files are written (it comes with relax-platform[runtime]; --no-use-tensorboard turns them off)",
                err,
            )
            return
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(str(directory), purge_step=self.plan.purge_step, flush_secs=10)
        except OSError as err:
            log.warning("--use-tensorboard: cannot write under %s (%s); no event files", directory, err)
            return
        log.info("TensorBoard event files: %s", directory)

    def _open_wandb(self, kwargs: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            log.warning(
                "--use-wandb: the wandb package is not installed on this cluster; nothing goes to W&B"
            )
            return
        try:
            if kwargs.get("dir"):
                Path(kwargs["dir"]).mkdir(parents=True, exist_ok=True)
            self._wandb_run = wandb.init(
                **{k: v for k, v in kwargs.items() if v is not None},
                settings=wandb.Settings(console="off", x_disable_stats=True),
                reinit="create_new",
            )
        except Exception as err:  # noqa: BLE001 - W&B's errors are many; the run goes on without it
            log.warning(
                "--use-wandb: W&B did not start (%s: %s); nothing goes to W&B", type(err).__name__, err
            )
            self._wandb_run = None
            return
        log.info("W&B run %s (%s mode) in %s", kwargs.get("name"), kwargs.get("mode"), kwargs.get("dir"))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if not values or (self._tb is None and self._wandb_run is None):
            return
        with self._lock:
            if self._tb is not None:
                try:
                    for name, value in values.items():
                        self._tb.add_scalar(name, float(value), global_step=step)
                except Exception as err:  # noqa: BLE001 - a full disk: the API still has every point
                    log.warning("TensorBoard: writing failed (%s); no more event files", err)
                    self._close_tensorboard()
            if self._wandb_run is not None:
                try:
                    self._wandb_run.log({k: float(v) for k, v in values.items()}, step=step)
                except Exception as err:  # noqa: BLE001
                    log.warning("W&B: logging failed (%s); nothing more goes to W&B", err)
                    self._close_wandb()

    def flush(self) -> None:
        with self._lock:
            if self._tb is not None:
                self._tb.flush()

    def _close_tensorboard(self) -> None:
        tb, self._tb = self._tb, None
        if tb is not None:
            _quietly(tb.close, "TensorBoard: closing")

    def _close_wandb(self) -> None:
        run, self._wandb_run = self._wandb_run, None
        if run is not None:
            _quietly(run.finish, "W&B: finishing the run")

    def close(self) -> None:
        with self._lock:
            self._close_tensorboard()
            self._close_wandb()


def _quietly(close: Callable[[], Any], what: str) -> None:
    """Run `close`; a failure is only logged (`what` failed), as nothing is lost that the API lacks."""
    try:
        close()
    except Exception as err:  # noqa: BLE001
        log.warning("%s failed (%s)", what, err)


def open_trackers(
    values: Mapping[str, Any], *, output_dir: str | Path | None, run_name: str, start_step: int = 0
) -> Trackers:
    """The trackers a job asks for, opened (those that cannot open said so in the log and stay off)."""
    return Trackers(
        tracker_plan(values, output_dir=output_dir, run_name=run_name, start_step=start_step)
    ).open()
