"""A checkpoint never gets ahead of the driver's reports (runtime/reporter.py `durable_through`, called by
`Pipeline.save`): once checkpoint `c` is on disk a resumed attempt starts at `c + 1`, so every point up to
`c` must be in the spool before a SIGKILL can take the driver. The chaos trials (bench/chaos.py) found
holes of up to 13 steps in a job's history: the points of the ~1 s before the checkpoint had not been cut
into a report yet."""

from __future__ import annotations

import time
from pathlib import Path

from runtime.reporter import HttpReporter
from runtime.spool import read_spool, spool_key


def _spooled_steps(folder: Path) -> list[int]:
    return [m["step"] for r in read_spool(folder, spool_key("tok")) for m in r.payload["metrics"]]


def test_points_up_to_a_checkpoint_are_on_disk_before_it_and_its_own_step_as_soon_as_reported(
    tmp_path: Path,
) -> None:
    # The API is unreachable, and the cutter would wait a minute: only durable_through writes in time.
    reporter = HttpReporter("http://127.0.0.1:9", "j", "tok", flush_interval=60, heartbeat_interval=600)
    try:
        reporter.attach_spool(tmp_path / "spool")
        for step in range(5):
            reporter.metrics(step, {"train/loss": 1.0, "perf/step_time": 0.1})
        assert _spooled_steps(tmp_path / "spool") == []  # nothing cut yet: a SIGKILL now loses them
        t0 = time.monotonic()
        reporter.durable_through(5)  # about to save the checkpoint of step 5
        assert time.monotonic() - t0 < 2
        assert _spooled_steps(tmp_path / "spool") == [s for s in range(5) for _ in (0, 1)]
        reporter.metrics(6, {})  # another step's empty eval metrics: nothing to wait for
        reporter.metrics(5, {"train/loss": 0.5})  # the checkpoint's own step, reported after the save
        assert _spooled_steps(tmp_path / "spool")[-1] == 5
        reporter.metrics(6, {"train/loss": 0.4})  # later steps are cut as usual (not written through)
        assert _spooled_steps(tmp_path / "spool")[-1] == 5
        assert reporter.persist() and _spooled_steps(tmp_path / "spool")[-1] == 6
    finally:
        reporter.close(timeout=0.1)


def test_persist_answers_at_once_with_nothing_pending_and_without_a_spool(tmp_path: Path) -> None:
    reporter = HttpReporter("http://127.0.0.1:9", "j", "tok", flush_interval=60, heartbeat_interval=600)
    try:
        t0 = time.monotonic()
        assert reporter.persist()  # in memory before the spool is attached: written means queued
        reporter.metrics(0, {"train/loss": 1.0})
        assert reporter.persist() and reporter.unsent_reports >= 1
        assert time.monotonic() - t0 < 2
    finally:
        reporter.close(timeout=0.1)
