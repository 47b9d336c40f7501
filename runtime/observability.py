"""Stage timing (each stage's fixed name is also its `perf/<stage>_time` metric) and the driver's logging setup."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from runtime.reporter import Reporter, ReporterLogHandler

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(job)s] %(message)s"


class Stage(StrEnum):
    """The driver's named stages, in pipeline order."""

    DATA = "data"  # next prompts (RL) or the next SFT batch
    ROLLOUT = "rollout"  # generation by the rollout engines
    REWARD = "reward"  # scoring samples
    LOG_PROBS = "log_probs"  # trainer recomputes old (unless true-on-policy) and reference log-probs
    VALUES = "values"  # PPO: the critic's values of the rollout (a no-op without a critic)
    ADVANTAGES = "advantages"  # advantage estimator
    TRAIN = "train"  # loss, backward, optimizer steps
    WEIGHT_SYNC = "weight_sync"  # trainer weights -> rollout engines
    SAVE = "save"  # checkpoint, HF export, rollout results
    EVAL = "eval"  # generation + reward on the eval sets

    @property
    def metric(self) -> str:
        return f"perf/{self.value}_time"


class StepTimer:
    """Wall time of each stage within one step, plus the whole step."""

    def __init__(self) -> None:
        self.seconds: dict[Stage, float] = {}
        self._start = time.perf_counter()
        self.step_seconds = 0.0

    @contextmanager
    def stage(self, stage: Stage) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def finish(self) -> None:
        self.step_seconds = time.perf_counter() - self._start

    def metrics(self) -> dict[str, float]:
        values = {stage.metric: seconds for stage, seconds in self.seconds.items()}
        values["perf/step_time"] = self.step_seconds
        return values


class _JobField(logging.Filter):
    def __init__(self, job: str) -> None:
        super().__init__()
        self.job = job

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "job"):
            record.job = self.job
        return True


def configure_logging(reporter: Reporter, *, job: str, level: int = logging.INFO) -> None:
    """Route the `runtime` loggers to stderr and, through the reporter, to the platform's job log."""
    logger = logging.getLogger("runtime")
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(LOG_FORMAT))
    job_field = _JobField(job)
    console.addFilter(job_field)
    logger.addHandler(console)
    logger.addHandler(ReporterLogHandler(reporter, level))
