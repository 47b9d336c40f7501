"""`--use-health-check` on a real local Ray with a real engine server (the tiny model, CPU): past
`--max-global-restart`, the job fails naming the engine and the count. The faults an engine is replaced after
(hung, dead, its node lost) are tests/ray/test_rollout_health_node.py's, in one run on a Ray cluster of three
nodes; the helpers here (the job's engine servers, the faults' thread, the spec) are that module's too."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from runtime import driver
from tests.ray.conftest import read_reports
from tests.ray.test_driver_grpo import grpo_spec

pytestmark = pytest.mark.ray

SERVER_MODULE = "runtime.rollout.sglang.server"


def engine_servers(within: Path) -> list[psutil.Process]:
    """This machine's engine server processes launched by Ray actors for a model under `within` (their
    command line names the module, the model and the process that launched them, `--relax-watch-pid`).
    `within` is this pytest worker's base temporary folder: the other worker runs whole platforms whose jobs
    launch engine servers through Ray too (a SIGKILL meant for this test's engine once killed one of those,
    failing that worker's test), and tests that launch servers in their own process
    (tests/unit/runtime/sglang/test_passthrough.py); neither kind is faulted nor counted as a stray."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if (
            SERVER_MODULE in cmd
            and "--relax-watch-pid" in cmd
            and "--model-path" in cmd
            and Path(cmd[cmd.index("--model-path") + 1]).is_relative_to(within)
            and proc.info["status"] != psutil.STATUS_ZOMBIE
            and _launched_by_ray(int(cmd[cmd.index("--relax-watch-pid") + 1]))
        ):
            found.append(proc)
    return found


def _launched_by_ray(pid: int) -> bool:
    try:
        return " ".join(psutil.Process(pid).cmdline()).startswith("ray::")  # Ray's title for its workers
    except psutil.Error:
        return True  # the launcher is gone (a SIGKILLed actor): its server is still the job's until it exits


def launcher_pid(server: psutil.Process) -> int:
    cmd = server.cmdline()
    return int(cmd[cmd.index("--relax-watch-pid") + 1])


def steps_done(out: Path) -> int:
    folder = out / "ckpt" / "rollout_result" / "train"
    return len(list(folder.glob("*.jsonl"))) if folder.is_dir() else 0


class Faults:
    """Runs `plan` (a list of (when, what)) in a thread while the driver runs: `when(out)` is polled."""

    def __init__(self, out: Path, plan: list[tuple[Callable[[Path], bool], Callable[[], str]]]) -> None:
        self.out = out
        self.plan = plan
        self.done: list[str] = []
        self.stopped: list[psutil.Process] = []
        self.error: BaseException | None = None
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for when, what in self.plan:
                while not when(self.out):
                    if self._quit.wait(0.1):
                        return
                self.done.append(what())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def __enter__(self) -> Faults:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._quit.set()
        self._thread.join(timeout=10)
        for proc in self.stopped:  # never leave a stopped server behind, whatever happened
            try:
                proc.kill()
            except psutil.Error:
                pass


@pytest.fixture
def no_stray_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = tmp_path_factory.getbasetemp()
    before = {p.pid for p in engine_servers(base)}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and {p.pid for p in engine_servers(base)} - before:
        time.sleep(0.2)
    assert not {p.pid for p in engine_servers(base)} - before, "engine servers outlived the job"


def health_spec(artifacts: dict[str, Path], out: Path, **overrides) -> dict:
    spec = grpo_spec(
        artifacts,
        out,
        **{
            "colocate": False,
            "resource": {"actor": [1, 1], "rollout": [1, 2]},
            "num-rollout": 30,
            "save-interval": None,
            "save-hf": None,
            "eval-interval": None,
            "eval-prompt-data": None,
            "use-kl-loss": False,
            "kl-loss-coef": 0.0,
            "lr-warmup-iters": 2,
            "use-health-check": True,
            "rollout-health-check-interval": 1.0,
            "rollout-health-check-timeout": 5.0,
            "max-global-restart": 3,
            **overrides,
        },
    )
    return {k: v for k, v in spec.items() if v is not None}


def run_job(spec: dict, out: Path, name: str) -> int:
    spec_file = out / f"{name}.json"
    spec_file.write_text(json.dumps({"name": name, "spec": spec}))
    return driver.main(["--spec-file", str(spec_file)])


def test_a_replacement_past_max_global_restart_fails_the_job(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, no_stray_servers: None
) -> None:
    """One engine and no replacement allowed: its death fails the job, naming the engine and the count, and
    its server does not outlive the job. (It ran two engines, both killed, with one replacement allowed: an
    engine and a replacement more to start, ~15 s on the loaded CI; that replacements count across engines
    is HealthMonitor's, unit-tested in tests/unit/runtime/test_rollout_health.py.)"""

    def kill_it() -> str:
        (server,) = engine_servers(tmp_path.parent)
        actor = launcher_pid(server)
        os.kill(actor, signal.SIGKILL)
        return f"SIGKILL actor {actor}"

    spec = health_spec(
        artifacts,
        tmp_path,
        **{"resource": {"actor": [1, 1], "rollout": [1, 1]}, "num-rollout": 30, "max-global-restart": 0},
    )
    with Faults(tmp_path, [(lambda out: steps_done(out) >= 1, kill_it)]) as faults:
        code = run_job(spec, tmp_path, "health-budget")
    assert faults.error is None, faults.error
    assert len(faults.done) == 1, faults.done
    assert code == 1
    events = [e for r in read_reports(tmp_path / "report") for e in r.get("events", [])]
    failed = [e["message"] for e in events if e["kind"] == "failed"]
    assert len(failed) == 1, events
    assert "RestartBudgetExceeded" in failed[0] and "past --max-global-restart=0" in failed[0], failed
    assert "rollout engine 0 is dead" in failed[0] and "replacement 1 of this run" in failed[0], failed
    assert steps_done(tmp_path) < 30
