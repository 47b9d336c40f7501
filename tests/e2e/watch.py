"""What the end-to-end tests watch on a running platform: the pools' slots over time (`SlotWatch`) and a
condition awaited with the platform's own account of a timeout (`until`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.harness import RunningPlatform
from client.sdk import RelaxClient


class SlotWatch:
    """Polls GET /v1/pools in the background while a test runs. Records as `problems` any pool or node with
    more GPUs allocated than it has (by its counters, or by the jobs it lists), the successive sets of jobs
    holding slots (`holders_seen`, one entry per change), and when each node was first seen down
    (`down_at`, wall-clock seconds)."""

    def __init__(self, c: RelaxClient, interval_s: float = 0.2) -> None:
        self.c = c
        self.interval_s = interval_s
        self.samples = 0
        self.problems: list[str] = []
        self.holders_seen: list[frozenset[str]] = []
        self.down_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slot-watch", daemon=True)

    def __enter__(self) -> SlotWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pools = self.c.pools()
            except Exception:  # noqa: BLE001 - a slow answer now and then is not what this watches
                self._stop.wait(self.interval_s)
                continue
            self.samples += 1
            holders: set[str] = set()
            for pool in pools:
                if pool["allocated_gpus"] > pool["total_gpus"]:
                    self.problems.append(
                        f"pool {pool['name']}: {pool['allocated_gpus']}/{pool['total_gpus']}"
                    )
                for node in pool["nodes"]:
                    held = sum(j["gpus"] for j in node["jobs"])
                    if node["allocated_gpus"] > node["gpus"] or held > node["gpus"]:
                        self.problems.append(f"node {node['name']}: {node['jobs']} on {node['gpus']} slot(s)")
                    holders |= {j["job_id"] for j in node["jobs"]}
                    if not node["alive"]:
                        self.down_at.setdefault(node["name"], time.time())
            if not self.holders_seen or self.holders_seen[-1] != frozenset(holders):
                self.holders_seen.append(frozenset(holders))
            self._stop.wait(self.interval_s)


def until(
    what: Callable[[], Any],
    timeout: float,
    c: RelaxClient,
    platform: RunningPlatform,
    *jobs: str,
    poll_s: float = 0.25,
) -> Any:
    """`what()`'s first truthy answer within `timeout` seconds; else an AssertionError with the pools, each
    of `jobs`' status and events, and the platform's log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(poll_s)
    detail = ""
    for job_id in jobs:
        job = c.get_job(job_id)
        detail += f"{job_id} is {job['status']} ({job['status_reason']})\n" + "\n".join(
            f"  {e['time']} {e['kind']} {e['from_status'] or ''}->{e['to_status'] or ''} {e['reason']}"
            for e in c.events(job_id)
        )
    raise AssertionError(f"not within {timeout}s: {what}\n{c.pools()}\n{detail}\n{platform.log()}")
