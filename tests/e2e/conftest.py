"""The embedded platform the end-to-end tests run against, with the tiny model: one platform shared by the
modules that use this `platform` fixture and run one after another on the same pytest worker, one of a single
slot shared likewise by those that use `one_slot_platform`, and one of three slots by those that use
`three_slot_platform` (a module that needs a platform of its own, configured otherwise, defines its own
`platform`)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import RunningPlatform, start_platform, stop_platform

# Starting a platform (API, Celery worker and beat, a Ray head; `relaxctl models tiny`) and stopping it takes
# 15-30 s on two busy cores: the modules below share one as long as they follow each other, and the lanes of
# tests/conftest.py put them next to each other. The platform stops when the next test on this worker does
# not use it (pytest's `nextitem`, known to xdist's workers too), so it never idles beside the light tests.
_SHARED: dict[str, RunningPlatform] = {}
_NEXT: dict[str, pytest.Item | None] = {}
SHARED_FIXTURE = "_e2e_shared_platform"


# Stopping a platform (SIGTERM: its API, worker, beat and Ray stopped in order) is mostly waiting for processes
# to exit: 5-6.5 s of a test's teardown at moderate load, ~2.3 CPU-s. A platform no later test uses is stopped
# in a thread of its own while the next tests run (`stop_later`); `_platforms_stopped_in_time` waits for each at
# the end of the session and fails there if one took 45 s or more.
_STOPPING: list[tuple[RunningPlatform, threading.Thread, dict[str, float]]] = []


def stop_later(p: RunningPlatform) -> None:
    """Stop `p` (bench.harness.stop_platform) in a thread; its time is checked at the end of the session."""
    took: dict[str, float] = {}
    thread = threading.Thread(
        target=lambda: took.update(s=stop_platform(p)), name=f"stop-platform-{p.proc.pid}", daemon=False
    )
    thread.start()
    _STOPPING.append((p, thread, took))


@pytest.fixture(scope="session", autouse=True)
def _platforms_stopped_in_time() -> Iterator[None]:
    yield
    slow = []
    for p, thread, took in _STOPPING:
        thread.join(120)
        if thread.is_alive() or took.get("s", 120.0) >= 45:
            slow.append(f"{p.home}: {took.get('s', 'not stopped after 120')} s")
    _STOPPING.clear()
    assert not slow, f"platforms that took 45 s or more to stop: {slow}"


def uses_shared_platform(item: pytest.Item | None) -> bool:
    return item is not None and SHARED_FIXTURE in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _NEXT["item"] = nextitem  # read by the fixture's teardown below, which runs inside this hook's call


# A second shared platform, of one slot and a reconcile every second, for tests/e2e/test_multinode.py (which joins
# two more nodes to it, and stops them before it hands it on) and tests/e2e/test_preemption.py (a pool of one
# slot): the first lane runs them next to each other, so it starts once for both (~20 s of the lane).
ONE_SLOT_FIXTURE = "one_slot_platform"
ONE_SLOT_ENV = {"RELAX_RAY_LOCAL_SLOTS": "1", "RELAX_SCHEDULER_TICK_SECONDS": "1"}

# A third, of three slots and a reconcile every second, for tests/e2e/test_elastic_rollout.py (an elastic job that
# grows into the third slot), test_megatron_learns.py (TP=2 on two of its slots, and the SFT warm-up that
# test_multinode.py copies later in the lane), test_network_exposure.py (a job of two slots) and then
# test_reliability.py, which kills it (it starts it again on the same home, with THREE_SLOT_ENV, and stops that
# one at its end). The first lane runs them next to each other, in file order (tests/conftest.py sorts by this
# fixture), so it starts once for the four (a start and a stop, and `relaxctl models tiny`: 25-60 s of the lane;
# test_megatron_learns and test_network_exposure had the shared platform of two slots to themselves there). (Not
# the last lane's shared platform: on a node of three slots every eval job is refused, jobspec's
# rule.actor_whole_nodes.)
THREE_SLOT_FIXTURE = "three_slot_platform"
THREE_SLOT_ENV = {"RELAX_RAY_LOCAL_SLOTS": "3", "RELAX_SCHEDULER_TICK_SECONDS": "1"}


def models_tiny(p: RunningPlatform) -> None:
    """`relaxctl models tiny` on the platform: the CLI's command run in this process (typer's runner, the
    platform's URL and key in the environment, the real API over HTTP), not in a `relaxctl` process of its own,
    which would spend ~4 s importing torch and transformers again (measured 5.7-6.3 s a call against 0.1 s in a
    process that has them, as a pytest worker of the suite soon does). Also for the modules' own platforms
    (tests/e2e/test_reliability.py, test_elastic_rollout.py)."""
    from typer.testing import CliRunner

    import client.cli as cli

    r = CliRunner().invoke(cli.app, ["models", "tiny"], env=p.env())
    assert r.exit_code == 0, f"{r.output}\n{r.exception!r}"
    assert "artifacts://models/tiny" in r.output, r.output


def _shared(key: str, fixture: str, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]):  # type: ignore[no-untyped-def]
    p = _SHARED.get(key)
    if p is None or p.proc.poll() is not None:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            p = start_platform(tmp_path_factory.mktemp("platform") / "home")
        _SHARED[key] = p
        models_tiny(p)
    yield p
    nextitem = _NEXT.pop("item", None)
    if nextitem is None or fixture not in getattr(nextitem, "fixturenames", ()):
        _SHARED.pop(key, None)
        stop_later(p)  # under 45 s: checked at the end of the session


@pytest.fixture(scope="module")
def _e2e_shared_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPlatform]:
    yield from _shared("platform", SHARED_FIXTURE, tmp_path_factory, {})


@pytest.fixture(scope="module")
def one_slot_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPlatform]:
    """An embedded platform whose pool `local` has one slot (RELAX_RAY_LOCAL_SLOTS=1) and whose scheduler ticks
    every second, `relaxctl models tiny` done; shared by the neighbouring modules that use it. A module that
    adds nodes removes them (and waits until the pool has them down) before it ends."""
    yield from _shared("one_slot", ONE_SLOT_FIXTURE, tmp_path_factory, ONE_SLOT_ENV)


@pytest.fixture(scope="module")
def three_slot_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPlatform]:
    """An embedded platform whose pool `local` has three slots and whose scheduler ticks every second,
    `relaxctl models tiny` done; shared by the neighbouring modules that use it. A module leaves no job of its
    own running when it ends; one that kills it stops what it started in its place."""
    yield from _shared("three_slot", THREE_SLOT_FIXTURE, tmp_path_factory, THREE_SLOT_ENV)


@pytest.fixture(scope="module")
def platform(_e2e_shared_platform: RunningPlatform) -> RunningPlatform:
    """An embedded platform in a temporary home, `relaxctl models tiny` done, shared with the neighbouring
    modules that use it (stopping it must take under 45 s, checked at the end of the session). Its jobs are the
    other modules' too: look jobs up by id, or by a name no other module uses."""
    return _e2e_shared_platform


# The SFT warm-up examples/sft-arith.yaml that grpo-arith.yaml, ppo-arith.yaml and grpo-arith-megatron.yaml start
# from (job://sft-arith/hf), per running platform: the modules that share a platform share it too (a run of it
# is a whole job, ~13 s alone on two cores and 20-30 s beside the other lane), as they share the platform.
_SFT_ARITH: dict[tuple[str, str, int], dict] = {}
# Their Hugging Face exports (`<output_dir>/hf`), for `sft_arith_start` on another platform of this process.
SFT_ARITH_EXPORTS: list[Path] = []


@pytest.fixture(scope="module")
def sft_arith(platform: RunningPlatform) -> dict:
    """The job of examples/sft-arith.yaml on this module's platform, submitted as it is with `relaxctl submit
    --wait` (which answered SUCCEEDED), the job SUCCEEDED and its log without an error or a traceback: run by
    the first test on this platform that needs it, the same job for the tests after it."""
    from client.sdk import RelaxClient

    key = (platform.url, str(platform.home), platform.proc.pid)
    job = _SFT_ARITH.get(key)
    if job is None:
        r = platform.relaxctl("submit", "examples/sft-arith.yaml", "--wait")
        assert r.returncode == 0, r.stdout + r.stderr + platform.log()
        assert "SUCCEEDED" in r.stdout, r.stdout
        c = RelaxClient(platform.url, platform.key)
        job = c.list_jobs(name="sft-arith")["data"][0]
        assert job["status"] == "SUCCEEDED", job
        assert log_problems(c, job["id"]) == []
        _SFT_ARITH[key] = job
        SFT_ARITH_EXPORTS.append(Path(job["output_dir"]) / "hf")
    return job


def sft_arith_start(p: RunningPlatform) -> str:
    """What `hf-checkpoint` and `ref-load` name on platform `p` for a job that starts from the SFT warm-up (as
    grpo-arith.yaml does from job://sft-arith/hf), for a module on a platform other than the one `sft_arith` ran
    on (tests/e2e/test_multinode.py): the export of an examples/sft-arith.yaml job this process already ran
    (`sft_arith`, on the lane's platform of three slots before; the same spec, seed, tiny model and data)
    copied into the team's area of `p`, else that of the job run on `p` now with `relaxctl submit --wait`. A
    run of the job is ~25 s alone on two cores, 60-70 s beside other work; the copy, 0.6 MB, none of it."""
    from client.sdk import RelaxClient

    for export in SFT_ARITH_EXPORTS:
        if (export / "model.safetensors").is_file() and (export / "tokenizer.json").is_file():
            area = Path(RelaxClient(p.url, p.key).storage()["area"])
            shutil.copytree(export, area / "models" / "sft-arith", dirs_exist_ok=True)
            return "artifacts://models/sft-arith"
    r = p.relaxctl("submit", "examples/sft-arith.yaml", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr + p.log()
    assert "SUCCEEDED" in r.stdout, r.stdout
    return "job://sft-arith/hf"


def log_problems(client, job_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A job's log lines (every page) at level ERROR or above or carrying a traceback: a job that succeeds
    has none (issue 16: a successful GRPO job used to end with an ERROR traceback from its engine actor)."""
    bad: list[str] = []
    after = 0
    while True:
        page = client.logs(job_id, after=after, limit=1000)
        for line in page["data"]:
            if (
                line["level"] in ("ERROR", "CRITICAL")
                or "Traceback (most recent call last)" in line["message"]
            ):
                bad.append(f"{line['source']} {line['level']}: {line['message'][:500]}")
        if not page["data"] or page["next_after"] == after:
            return bad
        after = page["next_after"]
