"""The embedded platform's supervisor (api/embedded.py) with real, tiny processes: a dead child is restarted
after a backoff and its state written for /readyz; a child past its restart budget stops the platform with
the reason; children die with their parent (PR_SET_PDEATHSIG); one platform per RELAX_HOME (a second one
refuses to start, naming the first); what a dead platform left running is stopped at the next start.
A few seconds; no Ray, no Celery (tests/e2e/test_reliability.py runs the real platform)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from api import embedded
from api.embedded import Part, Supervisor

ROOT = Path(__file__).resolve().parents[2]
SLEEP = ["sleep", "60"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_dead_child_is_restarted_after_a_backoff_and_its_state_is_written(tmp_path: Path) -> None:
    state = tmp_path / "platform.json"
    sup = Supervisor(tmp_path / "logs", state)
    sup.add(Part("worker", lambda: (SLEEP, None)))
    try:
        sup.start("worker")
        first = sup.parts["worker"].proc
        assert first is not None and json.loads(state.read_text())["parts"]["worker"]["state"] == "running"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)
        sup.poll()
        saved = json.loads(state.read_text())["parts"]["worker"]
        assert saved["state"] == "restarting" and saved["detail"] == "was killed by SIGKILL; restarting in 1s"
        time.sleep(1.1)
        sup.poll()
        part = sup.parts["worker"]
        assert part.state == "running" and part.restarts == 1 and part.proc is not None
        assert part.proc.pid != first.pid and part.proc.poll() is None and sup.fatal is None
        assert json.loads(state.read_text())["parts"]["worker"]["pid"] == part.proc.pid
    finally:
        sup.stop_all()


def test_a_child_past_its_budget_stops_the_platform_saying_why(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs", tmp_path / "platform.json")
    sup.add(Part("beat", lambda: (["sh", "-c", "exit 3"], None), budget=1))
    sup.start("beat")
    t0 = time.time()
    sup.run()  # dies, restarted after 1 s, dies again: past its budget of 1
    assert time.time() - t0 < 10
    assert sup.fatal is not None and sup.fatal.startswith(
        "the beat exited with code 3 (death 2 in 300s): not restarted"
    )
    assert str(tmp_path / "logs" / "beat.log") in sup.fatal
    assert sup.parts["beat"].state == "failed"
    assert json.loads((tmp_path / "platform.json").read_text())["status"] == "failed"


def test_children_die_with_their_parent(tmp_path: Path) -> None:
    """SIGKILL of a process that started a child with `spawn` (as the platform starts its worker, beat and
    API): the child is gone within a second or two, by PR_SET_PDEATHSIG."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from api.embedded import spawn\n"
        f"p = spawn(Path({str(tmp_path)!r}), 'child', ['sleep', '60'], None, 9)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert psutil.Process(child).ppid() == parent.pid
        parent.kill()
        parent.wait(5)
        assert _gone(child, 3), f"child {child} outlived its parent"
    finally:
        parent.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass


def test_a_second_platform_on_the_same_home_refuses_to_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "platform.json").write_text(json.dumps({"pid": 4242, "status": "running", "parts": {}}))
    fd = embedded.take_home_lock(run)
    try:
        with pytest.raises(embedded.AlreadyRunning, match=r"another Relax Platform \(pid 4242\) runs on"):
            embedded.take_home_lock(run)
        r = subprocess.run(
            [sys.executable, "-m", "api.embedded"],
            cwd=ROOT,
            env=os.environ | {"RELAX_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "another Relax Platform (pid 4242) runs on" in r.stderr, r.stderr[-2000:]
    finally:
        os.close(fd)
    os.close(embedded.take_home_lock(run))  # free once the first one is gone


def test_what_a_dead_platform_left_running_is_stopped_at_the_next_start(tmp_path: Path) -> None:
    from scheduler.settings import Settings

    settings = Settings(home=tmp_path)
    temp = embedded.ray_temp_dir(settings)
    worker = subprocess.Popen(SLEEP, start_new_session=True)
    # a stand-in for a Ray daemon of this home: it names the home's Ray temp dir on its command line
    ray = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={temp}"], start_new_session=True
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={temp}x"])
    try:
        state = tmp_path / "platform.json"
        part = {
            "pid": worker.pid,
            "create_time": psutil.Process(worker.pid).create_time(),
            "state": "running",
        }
        state.write_text(json.dumps({"pid": 1, "status": "running", "parts": {"worker": part}}))
        done = embedded.clean_leftovers(settings, state)
        assert f"stopped the previous platform's worker (pid {worker.pid})" in done
        assert any("process(es) of a Ray head left" in line for line in done), done
        worker.wait(5)
        ray.wait(15)
        assert other.poll() is None  # another home's Ray is not this one's
    finally:
        for p in (worker, ray, other):
            p.kill()
            p.wait(5)
