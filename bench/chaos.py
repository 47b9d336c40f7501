"""Crash trials on the real embedded platform: SIGKILL one of its processes at a random point of a job's
life, and check that nothing was lost, nothing got stuck and no slot was given twice (issue 11, item 5;
docs/reliability.md, "Crash trials and outages").

    python -m bench.chaos --trials 36 --seed 1 [--kinds api,beat,worker,driver,ray,everything]
                          [--steps 600] [--save-every 10] [--home DIR] [--json PATH]

Each trial submits the tiny SFT job (tests/e2e/test_reliability.py's: batches of 8, ~25 ms a step here,
`--steps` steps, a checkpoint every `--save-every`) and SIGKILLs, once, one of:

| kind | what is killed | the platform |
|---|---|---|
| `api` | the API server (uvicorn), the supervisor's `api` part | restarts it |
| `beat` | the Celery beat | restarts it |
| `worker` | the Celery worker | restarts it |
| `driver` | the job's driver process | the reconciler resumes the job from its checkpoint |
| `ray` | the Ray head's GCS (`gcs_server`) | the supervisor restarts Ray, the job is resumed |
| `everything` | the supervisor and every process under it (Ray, the driver), at once | started again by this bench on the same RELAX_HOME |

at a random point: a quarter of the trials while the job is QUEUED (at once after the submission) or
STARTING (its driver process just appeared), the others a random 0..`--max-delay` s after it is RUNNING.
One platform serves every trial (kinds in shuffled rounds, so no part dies more often than its restart
budget allows); only `everything` starts it again.

What each trial checks (a failure prints the job's events and is written to `<home>/chaos-failures.txt`):

1. Not lost, not stuck: the job is SUCCEEDED within `--bound` s of the kill; it is never RUNNING without a
   live driver process for more than 60 s, nor ADMITTED/STARTING (one attempt) without one for more than
   120 s (the launch and Ray's start of the job); it never has two live drivers at once. The longest such
   stretches are in the table.
2. Every metric point exactly once, read from the API (`GET /v1/jobs/{id}/metrics`, each point with its
   `attempt`). Attempt `a` resumed from checkpoint `r_a` (its `resumed` event; -1: from the start), so it
   trains steps `r_a + 1 ...`. For every series, no (attempt, step) is stored twice. For `train/loss`:
   each attempt's steps are exactly `r_a + 1 ... L_a` (contiguous from its resume step, nothing missing
   in between); the job's history is whole: every step `s` of `0 ... steps-1` is stored by the attempt
   that owns it (the one with `r_a < s <= r_(a+1)`; the last attempt up to the last step). Steps an
   attempt trained past the checkpoint its successor resumed from were trained again, so a killed driver
   may lack a tail of them (what it had not yet written to its spool, ~1 s): counted as `redone`, checked
   against the `step k/N` lines of its Ray job log where that log is still on disk. One hole is counted,
   not failed (`ckpt gaps`): a driver killed after writing the checkpoint of step `c` and before reporting
   step `c` (the loop saves a step's checkpoint, then reports the step), when its log confirms that step `c`
   was never reported: that point never existed, and the next attempt starts at `c + 1`. For the kinds that
   leave the driver alone (`api`, `beat`, `worker`) the job has one attempt and `train/loss` is exactly
   `0 ... steps-1`, each once, and equals what its driver's log says it trained.
3. No slot allocated to nothing or to two jobs: in every `GET /v1/pools` answer during the trial, no node
   has more GPUs allocated than it has, the jobs with allocation rows are the jobs holding slots; in every
   `GET /v1/jobs/{id}`, a job holding slots has allocation rows for its `total_gpus`, one that does not has
   none; at the end the pool's `allocated_gpus` is 0.
4. One of each: once the job is done, one API server, one worker, one beat and one Ray head of this home
   run (the issue's two Ray heads and two workers), and no driver of the job is left.

Recovery time: from the kill until the killed part runs anew (the supervisor's state), `/readyz` answers 200
and the job is RUNNING with a report of its driver stored after the kill, from a later attempt where the
kill took the driver (or the job is SUCCEEDED); for `everything` it includes this bench's restart of the
platform.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.harness import ROOT, RunningPlatform, start_platform, stop_platform
from wire.jobs import HOLDING_SLOTS, TERMINAL, JobStatus

KINDS = ("api", "beat", "worker", "driver", "ray", "everything")
KILLS_DRIVER = frozenset({"driver", "ray", "everything"})
HOLDING = HOLDING_SLOTS
# How long a job may hold slots without a live driver process: RUNNING (the bound: its driver died
# and the platform has not noticed), and ADMITTED/STARTING of one attempt (the launch and the Ray job's
# start, which Ray's runtime environment and worker start make ~15-40 s here).
NO_DRIVER_LIMIT = {"RUNNING": 60.0, "launch": 120.0}
_STEP_LINE = re.compile(r"\bstep (\d+)/(\d+)\b")


# ---- the job -----------------------------------------------------------------------------------------------
def tiny_spec(steps: int, save_every: int) -> dict:
    """The tiny model's SFT example, small: batches of 8 (~40 ms a step here), a checkpoint every
    `save_every` steps, `steps` steps."""
    spec = dict(yaml.safe_load((ROOT / "examples" / "sft-arith.yaml").read_text())["spec"])
    spec.pop("save-hf")
    spec.update(
        {
            "rollout-batch-size": 8,
            "global-batch-size": 8,
            "max-tokens-per-gpu": 1024,
            "num-rollout": steps,
            "save-interval": save_every,
        }
    )
    return spec


# ---- the platform's processes ------------------------------------------------------------------------------
def platform_state(p: RunningPlatform) -> dict:
    return json.loads((p.home / "run" / "platform.json").read_text())


def readyz(p: RunningPlatform) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(f"{p.url}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
    except (OSError, ValueError):
        return None, {}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def driver_pids(job_id: str) -> list[int]:
    """The job's live driver processes (the Python of `runtime.bootstrap --job-id <id>`, not its shell)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        argv = proc.info["cmdline"] or []
        if (
            argv
            and "python" in Path(argv[0]).name
            and "runtime.bootstrap" in argv
            and job_id in argv
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append(proc.pid)
    return found


def ray_temp(home: Path) -> Path:
    from api.embedded import ray_temp_dir
    from scheduler.settings import Settings

    return ray_temp_dir(Settings(home=home))


def home_processes(home: Path) -> dict[str, list[int]]:
    """The platform's processes of this home, wherever they hang (an orphan too): API servers, workers,
    beats (by their RELAX_HOME) and Ray heads (their GCS, by the home's Ray temp dir)."""
    from api.embedded import ray_processes

    out: dict[str, list[int]] = {"api": [], "worker": [], "beat": [], "ray": []}
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        argv = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or not argv:
            continue
        line = " ".join(argv)
        kind = (
            "api"
            if "uvicorn" in line and "api.app:create_app" in line
            else "worker"
            if "scheduler.worker" in line and " worker" in line
            else "beat"
            if "scheduler.worker" in line and " beat" in line
            else None
        )
        if kind is None:
            continue
        try:
            if proc.environ().get("RELAX_HOME") != str(home):
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out[kind].append(proc.pid)
    out["ray"] = [p.pid for p in ray_processes(ray_temp(home)) if "gcs_server" in " ".join(_cmdline(p))]
    return out


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def kill_everything(p: RunningPlatform) -> int:
    """SIGKILL the supervisor and every process under it (and every process of its home's Ray, and the
    drivers), all at once, as a power cut of the platform's processes would. Returns how many."""
    from api.embedded import ray_processes

    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(p.proc.pid)
        procs[root.pid] = root
        procs |= {c.pid: c for c in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    procs |= {r.pid: r for r in ray_processes(ray_temp(p.home))}
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    p.proc.wait(30)
    psutil.wait_procs(list(procs.values()), timeout=10)
    return len(procs)


def gcs_pid(p: RunningPlatform) -> int | None:
    pids = home_processes(p.home)["ray"]
    return pids[0] if pids else None


# ---- the checks --------------------------------------------------------------------------------------------
@dataclass
class MetricsCheck:
    failures: list[str] = field(default_factory=list)
    points: int = 0  # every stored point of every series, each checked for duplicates
    loss_points: int = 0  # train/loss points checked for contiguity and the job's history
    redone: int = 0  # steps a killed attempt trained past its successor's resume point
    lost_redone: int = 0  # of those, trained (its log says) but not stored: the SIGKILL's unsent tail
    ckpt_gaps: int = 0  # killed after the checkpoint of a step, before that step was reported (see docs)
    attempts: int = 0


def attempt_resumes(events: list[dict]) -> dict[int, int]:
    """Attempt -> the checkpoint iteration it resumed from (-1: from the start). An attempt begins at its
    transition to STARTING; its driver's `resumed` event follows it (a report of attempt a is stored
    before a+1 starts: a late one is refused, a spooled one collected before the requeue)."""
    attempt, out = 0, {}
    for e in events:
        if e["kind"] == "transition" and e["to_status"] == "STARTING":
            attempt += 1
            out[attempt] = -1
        elif e["kind"] == "resumed" and attempt:
            out[attempt] = int(e["reason"].split()[-1])
    return out


def driver_log_steps(home: Path, sub_id: str) -> set[int] | None:
    """The steps (0-based) the driver of Ray job `sub_id` logged as trained, from its Ray job log on disk
    (`step k/N` is logged after the step's metrics were handed to the reporter); None without the log."""
    logs = sorted(ray_temp(home).glob(f"session_*/logs/job-driver-{sub_id}.log"))
    if not logs:
        return None
    steps: set[int] = set()
    for log in logs:
        for m in _STEP_LINE.finditer(log.read_text(errors="replace")):
            steps.add(int(m.group(1)) - 1)
    return steps


def check_metrics(
    series: dict[str, list[dict]], events: list[dict], steps: int, *, single: bool, home: Path, job_id: str
) -> MetricsCheck:
    """Check 2 of the module's docstring."""
    out = MetricsCheck()
    resumes = attempt_resumes(events)
    out.attempts = len(resumes)
    for name, points in series.items():
        out.points += len(points)
        seen: dict[tuple[int, int], int] = {}
        for pt in points:
            key = (pt["attempt"], pt["step"])
            seen[key] = seen.get(key, 0) + 1
        dups = sorted(k for k, n in seen.items() if n > 1)
        if dups:
            out.failures.append(f"{name}: (attempt, step) stored more than once: {dups[:10]}")
    loss: dict[int, list[int]] = {}
    for pt in series.get("train/loss", []):
        loss.setdefault(pt["attempt"], []).append(pt["step"])
    out.loss_points = sum(len(v) for v in loss.values())
    unknown = sorted(set(loss) - set(resumes))
    if unknown:
        out.failures.append(f"train/loss points of attempts that never started: {unknown}")
    attempts = sorted(resumes)
    for i, a in enumerate(attempts):
        got = sorted(set(loss.get(a, [])))
        r = resumes[a]
        if got and got != list(range(r + 1, got[-1] + 1)):
            holes = sorted(set(range(r + 1, got[-1] + 1)) - set(got))
            before = [s for s in got if s <= r]
            out.failures.append(
                f"attempt {a} (resumed from {r}): train/loss not contiguous from its resume step: "
                f"missing {holes[:10]}{'...' if len(holes) > 10 else ''}, before it {before[:10]}"
            )
        upto = resumes[attempts[i + 1]] if i + 1 < len(attempts) else steps - 1
        owned = set(range(r + 1, upto + 1))
        missing = sorted(owned - set(got))
        logged = driver_log_steps(home, f"{job_id}-a{a}")
        if missing and i + 1 < len(attempts) and missing == [upto] and (logged is None or upto not in logged):
            # killed between its checkpoint of step `upto` and reporting that step (the loop reports a step
            # after its save): a point never produced, and no attempt trains that step again
            out.ckpt_gaps += 1
        elif missing:
            out.failures.append(
                f"attempt {a} owns steps {r + 1}..{upto} of the job's history; missing {len(missing)}: "
                f"{missing[:10]}{'...' if len(missing) > 10 else ''}"
            )
        beyond = [s for s in got if s > upto]
        out.redone += len(beyond)
        if logged is not None:
            extra = sorted(set(got) - logged)
            if extra and i + 1 == len(attempts):
                out.failures.append(f"attempt {a}: stored steps its driver never logged: {extra[:10]}")
            out.lost_redone += len({s for s in logged if s > upto} - set(got))
            if single and sorted(logged) != got:
                out.failures.append(
                    f"attempt {a}: its driver logged {len(logged)} steps, {len(got)} stored: "
                    f"not stored {sorted(logged - set(got))[:10]}"
                )
    if single:
        if attempts != [1]:
            out.failures.append(f"the driver was not killed, yet the job ran {len(attempts)} attempts")
        if sorted(s for pts in loss.values() for s in pts) != list(range(steps)):
            out.failures.append("train/loss is not exactly steps 0..N-1, each once")
    return out


def check_pool(pools: list[dict]) -> list[str]:
    """Check 3 on one `GET /v1/pools` answer (one snapshot of the database)."""
    problems = []
    for pool in pools:
        holders: set[str] = set()
        for node in pool["nodes"]:
            if node["allocated_gpus"] > node["gpus"]:
                problems.append(
                    f"pool {pool['name']} node {node['name']}: {node['allocated_gpus']} of {node['gpus']} "
                    f"GPUs allocated ({node['jobs']})"
                )
            holders |= {j["job_id"] for j in node["jobs"]}
        if len(holders) != pool["jobs_holding_slots"]:
            problems.append(
                f"pool {pool['name']}: {pool['jobs_holding_slots']} job(s) hold slots, allocation rows name "
                f"{sorted(holders)} ({pool['allocated_gpus']} GPUs)"
            )
    return problems


def check_job_slots(job: dict) -> str | None:
    gpus = sum(a["gpus"] for a in job.get("allocations") or [])
    if job["status"] in HOLDING and job["status"] != JobStatus.ADMITTED and gpus < job["total_gpus"]:
        return f"{job['status']} with {gpus} of its {job['total_gpus']} GPUs allocated"
    if job["status"] not in HOLDING and gpus:
        return f"{job['status']} and still {gpus} GPUs allocated"
    return None


# ---- the trials --------------------------------------------------------------------------------------------
@dataclass
class Trial:
    index: int
    kind: str
    phase: str  # queued | starting | running (what was planned)
    delay: float  # seconds after RUNNING (running phase)
    killed_in: str = ""  # the job's status at the kill
    step_at_kill: int | None = None  # its progress then (steps trained, as last reported)
    job_id: str = ""
    passed: bool = False
    failures: list[str] = field(default_factory=list)
    points: int = 0
    loss_points: int = 0
    redone: int = 0
    lost_redone: int = 0
    ckpt_gaps: int = 0
    attempts: int = 0
    no_driver_running_s: float = 0.0  # the longest stretch RUNNING without a live driver
    no_driver_launch_s: float = 0.0  # ... and ADMITTED/STARTING (one attempt) without one
    recovery_s: float | None = None
    to_success_s: float | None = None
    events: list[str] = field(default_factory=list)


class Chaos:
    def __init__(self, home: Path, *, steps: int, save_every: int, max_delay: float, bound: float) -> None:
        self.home, self.steps, self.save_every = home, steps, save_every
        self.max_delay, self.bound = max_delay, bound
        self.platform: RunningPlatform | None = None
        self.starts = 0  # by ensure_platform: the first, and after the platform stopped by itself
        self._client: tuple[str, Any] | None = None

    # -- the platform ---------------------------------------------------------------------------------------
    def client(self):  # type: ignore[no-untyped-def]
        from client.sdk import RelaxClient

        assert self.platform is not None
        if self._client is None or self._client[0] != self.platform.url:
            self._client = (self.platform.url, RelaxClient(self.platform.url, self.platform.key, timeout=15))
        return self._client[1]

    def ensure_platform(self) -> RunningPlatform:
        if self.platform is None or self.platform.proc.poll() is not None:
            if self.platform is not None:
                print(f"  the platform had stopped:\n{self.platform.log()[-2000:]}", flush=True)
            self.platform = start_platform(self.home)
            self.starts += 1
            r = self.platform.relaxctl("models", "tiny")
            if r.returncode != 0:
                raise RuntimeError(r.stdout + r.stderr)
        deadline = time.time() + 120
        while readyz(self.platform)[0] != 200:
            if time.time() > deadline:
                raise RuntimeError(f"/readyz not 200 before the trial: {readyz(self.platform)}")
            time.sleep(0.5)
        return self.platform

    def stop(self) -> None:
        if self.platform is not None:
            stop_platform(self.platform)

    # -- one trial ------------------------------------------------------------------------------------------
    def run(self, trial: Trial) -> Trial:
        self.ensure_platform()
        c = self.client()
        job_id = c.submit_job(spec=tiny_spec(self.steps, self.save_every), name=f"chaos-{trial.index}")["id"]
        trial.job_id = job_id
        watch = Watch(self, job_id)
        try:
            t_kill = self._kill_point(trial, watch)
            trial.killed_in = watch.status
            trial.step_at_kill = watch.job.get("progress_step")
            watch.attempt_at_kill = int(watch.job.get("attempt") or 0)
            watch.new_attempt = trial.kind in KILLS_DRIVER
            self._kill(trial, watch)
            self._after(trial, watch, t_kill)
        except Exception as err:  # noqa: BLE001 - a trial that breaks is a failed trial, with its reason
            trial.failures.append(f"{type(err).__name__}: {err}")
        finally:
            self._finish(trial, watch)
        return trial

    def _kill_point(self, trial: Trial, watch: Watch) -> float:
        if trial.phase == "queued":
            watch.poll()
        elif trial.phase == "starting":
            watch.until(lambda: bool(driver_pids(trial.job_id)) or watch.status == "RUNNING", 180)
            time.sleep(random.uniform(0, 1.5))
            watch.poll()
        else:
            watch.until(lambda: watch.status == "RUNNING", 180)
            end = time.time() + trial.delay
            while time.time() < end:
                watch.poll()
                time.sleep(min(0.3, max(0.0, end - time.time())))
            watch.poll()
        if trial.kind == "driver" and not driver_pids(trial.job_id):
            watch.until(lambda: bool(driver_pids(trial.job_id)), 180)
        return time.time()

    def _kill(self, trial: Trial, watch: Watch) -> None:
        p = self.platform
        assert p is not None
        if trial.kind in ("api", "beat", "worker", "ray"):  # recovered once the supervisor replaced it
            watch.replaced = (trial.kind, platform_state(p)["parts"][trial.kind]["pid"])
        if trial.kind in ("api", "beat", "worker"):
            os.kill(platform_state(p)["parts"][trial.kind]["pid"], signal.SIGKILL)
        elif trial.kind == "driver":
            for pid in driver_pids(trial.job_id):
                os.kill(pid, signal.SIGKILL)
        elif trial.kind == "ray":
            pid = gcs_pid(p)
            if pid is None:
                raise RuntimeError("no GCS process of this home's Ray")
            os.kill(pid, signal.SIGKILL)
        else:
            kill_everything(p)
            watch.poll()  # the API is down: its last answer stands, and the clock without a driver starts
            self.platform = start_platform(self.home)
        watch.poll()

    def _after(self, trial: Trial, watch: Watch, t_kill: float) -> None:
        deadline = t_kill + self.bound
        while time.time() < deadline:
            watch.poll()
            if trial.recovery_s is None and watch.recovered(t_kill):
                trial.recovery_s = time.time() - t_kill
            if watch.status in TERMINAL:
                break
            time.sleep(0.5)
        if watch.status == "SUCCEEDED":
            trial.to_success_s = time.time() - t_kill
            if trial.recovery_s is None:
                trial.recovery_s = trial.to_success_s
        else:
            trial.failures.append(
                f"the job is {watch.status} {self.bound:.0f}s after the kill ({watch.job.get('status_reason')})"
            )

    def _finish(self, trial: Trial, watch: Watch) -> None:
        trial.failures += watch.problems
        trial.no_driver_running_s = round(watch.longest["RUNNING"], 1)
        trial.no_driver_launch_s = round(watch.longest["launch"], 1)
        c = self.client()
        try:
            events = c.events(trial.job_id)
        except Exception as err:  # noqa: BLE001
            events = []
            trial.failures.append(f"events unavailable: {err}")
        trial.events = [
            f"{e['time'][11:23]} {e['kind']} {e['from_status'] or ''}->{e['to_status'] or ''} {e['reason'] or ''}"
            for e in events
            if e["kind"] not in ("checkpoint_saved", "checkpoint_removed")
        ]
        if watch.status == "SUCCEEDED":
            series = c.metrics(trial.job_id)
            check = check_metrics(
                series,
                events,
                self.steps,
                single=trial.kind not in KILLS_DRIVER,
                home=self.home,
                job_id=trial.job_id,
            )
            trial.failures += check.failures
            trial.points, trial.loss_points, trial.attempts = check.points, check.loss_points, check.attempts
            trial.redone, trial.lost_redone, trial.ckpt_gaps = (
                check.redone,
                check.lost_redone,
                check.ckpt_gaps,
            )
            # one of each part (once the platform is whole again), no driver left (give a driver a few
            # seconds to exit after its last report)
            deadline = time.time() + 60
            while time.time() < deadline and readyz(self.platform)[0] != 200:  # type: ignore[arg-type]
                time.sleep(0.5)
            deadline = time.time() + 20
            while time.time() < deadline and driver_pids(trial.job_id):
                time.sleep(0.5)
            if driver_pids(trial.job_id):
                trial.failures.append(f"driver(s) still alive after SUCCEEDED: {driver_pids(trial.job_id)}")
            procs = home_processes(self.home)
            extra = {k: v for k, v in procs.items() if len(v) != 1}
            if extra:
                trial.failures.append(f"not one of each part of the platform: {extra}")
            pools = c.pools()
            if any(pool["allocated_gpus"] for pool in pools):
                trial.failures.append(f"GPUs still allocated after the job: {check_pool(pools) or pools}")
        else:  # leave nothing holding slots for the next trial
            try:
                c.cancel_job(trial.job_id)
            except Exception:  # noqa: BLE001
                pass
        trial.passed = not trial.failures


class Watch:
    """What the bench sees of one job while a trial runs (checks 1 and 3, as it goes)."""

    def __init__(self, chaos: Chaos, job_id: str) -> None:
        self.chaos, self.job_id = chaos, job_id
        self.job: dict[str, Any] = {}
        self.status = "?"
        self.problems: list[str] = []
        self.no_driver: tuple[str, int, float] | None = None  # (RUNNING | launch, attempt, since)
        self.longest = {"RUNNING": 0.0, "launch": 0.0}  # the longest such stretches seen
        self.attempt_at_kill = 0
        self.new_attempt = False  # recovered only with a later attempt (the kill took the driver)
        self.replaced: tuple[str, int] | None = None  # (part, pid): recovered only once it runs anew
        self._said: set[str] = set()
        self._next_pool = 0.0

    def _problem(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.problems.append(text)

    def poll(self) -> None:
        now = time.time()
        c = self.chaos.client()
        try:
            self.job = c.get_job(self.job_id)
            self.status = self.job["status"]
            bad = check_job_slots(self.job)
            if bad:
                again = c.get_job(self.job_id)  # a job moving between the two reads is not a problem
                if check_job_slots(again) and again["status"] == self.status:
                    self._problem("slots", f"job {bad}")
            if now >= self._next_pool:
                self._next_pool = now + 2
                bad_pool = check_pool(c.pools())
                if bad_pool:
                    self._problem("pool", "; ".join(bad_pool))
        except Exception:  # noqa: BLE001 - the API is down (a kill): judge by the last answer
            pass
        drivers = driver_pids(self.job_id)
        if len(drivers) > 1:
            self._problem("two", f"{len(drivers)} live drivers at once: {drivers}")
        if self.status in (JobStatus.ADMITTED, JobStatus.STARTING, JobStatus.RUNNING) and not drivers:
            key = ("RUNNING" if self.status == "RUNNING" else "launch", int(self.job.get("attempt") or 0))
            if self.no_driver is None or self.no_driver[:2] != key:
                self.no_driver = (*key, now)
            what, _attempt, since = self.no_driver
            self.longest[what] = max(self.longest[what], now - since)
            if now - since > NO_DRIVER_LIMIT[what]:
                self._problem(
                    "stuck",
                    f"{self.status} (attempt {key[1]}) without a live driver for {now - since:.0f}s "
                    f"({self.job.get('status_reason')})",
                )
        else:
            self.no_driver = None

    def until(self, what, timeout: float) -> None:  # type: ignore[no-untyped-def]
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll()
            if what():
                return
            if self.status in TERMINAL:
                break
            time.sleep(0.2)
        raise RuntimeError(
            f"the job is {self.status} ({self.job.get('status_reason')}), not at the kill point"
        )

    def recovered(self, t_kill: float) -> bool:
        """The platform is whole again (the killed part runs anew, `/readyz` 200) and the job trains again:
        RUNNING, its driver (of a later attempt, when the kill took the driver) reported after the kill."""
        platform = self.chaos.platform
        if self.replaced is not None and platform is not None:
            try:
                part = platform_state(platform)["parts"][self.replaced[0]]
            except (OSError, ValueError, KeyError):
                return False
            if part["pid"] == self.replaced[1] or part["state"] != "running":
                return False
        if self.status == "SUCCEEDED":
            return True
        last = self.job.get("last_report_at")
        if not last or self.status != "RUNNING":
            return False
        if self.new_attempt and int(self.job.get("attempt") or 0) <= self.attempt_at_kill:
            return False
        at = datetime.fromisoformat(last.replace("Z", "+00:00"))
        at = at if at.tzinfo else at.replace(tzinfo=UTC)
        return at.timestamp() > t_kill and platform is not None and readyz(platform)[0] == 200


# ---- the table ---------------------------------------------------------------------------------------------
def plan(trials: int, kinds: list[str], seed: int, max_delay: float) -> list[Trial]:
    """Kinds in shuffled rounds; a quarter of the kills while QUEUED or STARTING."""
    rng = random.Random(seed)
    out: list[Trial] = []
    while len(out) < trials:
        round_ = list(kinds)
        rng.shuffle(round_)
        for kind in round_[: trials - len(out)]:
            early = rng.random() < 0.25
            phase = rng.choice(["queued", "starting"]) if early else "running"
            if kind == "driver" and phase == "queued":
                phase = "starting"  # a queued job has no driver to kill
            delay = round(rng.uniform(0, max_delay), 2) if phase == "running" else 0.0
            out.append(Trial(index=len(out) + 1, kind=kind, phase=phase, delay=delay))
    return out


def table(trials: list[Trial], kinds: list[str]) -> str:
    head = f"{'kill':<11}{'trials':>7}{'passed':>7}{'early':>7}{'points':>9}{'loss pts':>9}{'redone':>8}"
    head += f"{'lost(redone)':>13}{'ckpt gaps':>10}{'attempts':>9}{'recovery median':>16}{'max':>7}"
    head += f"{'no driver: RUNNING':>19}{'launch':>8}"
    lines = [head, "-" * len(head)]
    for kind in [*kinds, "all"]:
        ts = [t for t in trials if t.kind == kind or kind == "all"]
        if not ts:
            continue
        rec = [t.recovery_s for t in ts if t.recovery_s is not None]
        lines.append(
            f"{kind:<11}{len(ts):>7}{sum(t.passed for t in ts):>7}"
            f"{sum(t.phase != 'running' for t in ts):>7}{sum(t.points for t in ts):>9}"
            f"{sum(t.loss_points for t in ts):>9}{sum(t.redone for t in ts):>8}"
            f"{sum(t.lost_redone for t in ts):>13}{sum(t.ckpt_gaps for t in ts):>10}"
            f"{sum(t.attempts for t in ts):>9}"
            f"{(f'{statistics.median(rec):.1f} s' if rec else '-'):>16}"
            f"{(f'{max(rec):.1f} s' if rec else '-'):>7}"
            f"{max(t.no_driver_running_s for t in ts):>17.1f} s{max(t.no_driver_launch_s for t in ts):>6.1f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=36)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--max-delay", type=float, default=10.0, help="latest kill, in s after RUNNING")
    ap.add_argument("--bound", type=float, default=300.0, help="s after the kill to reach SUCCEEDED")
    ap.add_argument("--home", type=Path, default=None, help="default: a new folder under /tmp")
    ap.add_argument("--json", type=Path, default=None, help="write every trial as JSON here")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(KINDS):
        ap.error(f"--kinds: one of {','.join(KINDS)}")
    home = (args.home or Path(f"/tmp/relax-chaos-{os.getpid()}")).resolve()
    trials = plan(args.trials, kinds, args.seed, args.max_delay)
    random.seed(args.seed)
    chaos = Chaos(
        home, steps=args.steps, save_every=args.save_every, max_delay=args.max_delay, bound=args.bound
    )
    failures = home / "chaos-failures.txt"
    print(f"{len(trials)} trials on RELAX_HOME={home}; failures go to {failures}", flush=True)

    def _interrupted(signum: int, _frame: object) -> None:  # SIGTERM (a timeout): stop the platform, say so
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _interrupted)
    t0, done = time.time(), []
    try:
        for trial in trials:
            started = time.time()
            chaos.run(trial)
            done.append(trial)
            _print_trial(trial, time.time() - started, failures)
            if args.json:
                args.json.write_text(json.dumps([asdict(t) for t in done], indent=1))
    except KeyboardInterrupt as err:
        print(f"\ninterrupted ({err or 'SIGINT'}) after {len(done)} trial(s)", flush=True)
    finally:
        chaos.stop()
    print(
        f"\n{len(done)} trials, seed {args.seed}, {args.steps} steps a job, a checkpoint every "
        f"{args.save_every}; {time.time() - t0:.0f} s in all; the platform started {chaos.starts} time(s) "
        f"(1: it never stopped by itself) and {sum(t.kind == 'everything' for t in done)} time(s) after "
        "`everything`\n"
    )
    print(table(done, kinds))
    return 0 if done and all(t.passed for t in done) and len(done) == len(trials) else 1


def _print_trial(trial: Trial, took: float, failures: Path) -> None:
    rec = f"{trial.recovery_s:.1f}s" if trial.recovery_s is not None else "-"
    print(
        f"[{trial.index:>3}] {trial.kind:<10} {trial.phase:<8} +{trial.delay:>4.1f}s "
        f"(killed {trial.killed_in:<9} at step {trial.step_at_kill}) {'ok  ' if trial.passed else 'FAIL'} "
        f"attempts={trial.attempts} points={trial.points} redone={trial.redone} lost={trial.lost_redone} "
        f"gaps={trial.ckpt_gaps} recovery={rec} ({took:.0f}s) {trial.job_id}",
        flush=True,
    )
    if not trial.passed:
        with failures.open("a") as fh:
            fh.write(f"== trial {trial.index} {trial.kind} {trial.phase} +{trial.delay}s {trial.job_id}\n")
            fh.writelines(f"  FAIL {f}\n" for f in trial.failures)
            fh.writelines(f"  {e}\n" for e in trial.events)
        for f in trial.failures:  # the whole text (a platform's log) is in the failures file
            print(f"      FAIL {f[:300]}{' …' if len(f) > 300 else ''}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
