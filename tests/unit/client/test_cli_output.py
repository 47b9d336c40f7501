"""What `relaxctl` prints, against the real API (the app served by uvicorn in a thread, over SQLite; a
driver's reports through its internal endpoint): tables at 80 columns keep every id and name whole and tell similar metric names
apart, `--wide` shows every column and `--json` the API's data; steps are numbered as the driver's log
numbers them; slots of the CPU pool are called CPU; `--wait` prints steps and events in the order they
happened."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from rich.console import Console
from typer.testing import CliRunner

import client.cli as cli
import client.commands as commands
from api.app import create_app
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.dispatch import CeleryDispatcher
from scheduler.services.job_tokens import bootstrap_secret
from scheduler.services.lifecycle import JobLifecycle
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, grpo_spec, make_broker_app

NAMES = ("grpo-qwen3-4b-math-lr1e-6-seed-1", "grpo-qwen3-4b-math-lr1e-6-seed-2")
#: A step's own metrics (stored under the step's index from 0) and an evaluation (under the steps done).
STEP_METRICS = (
    "rollout/raw_reward",
    "rollout/raw_reward_std",
    "rollout/reward",
    "train/loss",
    "perf/step_time",
)


class Api:
    def __init__(self, client: httpx.Client, settings: Settings, db: Database) -> None:
        self.client, self.settings, self.db = client, settings, db
        self.seq: dict[str, int] = {}

    def submit(self, name: str) -> str:
        r = self.client.post("/v1/jobs", json={"name": name, "spec": grpo_spec()})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def start(self, job_id: str) -> dict[str, str]:
        """What the scheduler and a worker do, then the driver's first report (the job becomes RUNNING)."""
        with self.db.session() as s:
            svc = JobLifecycle(s)
            svc.transition(job_id, "ADMITTED", expected_from="QUEUED", reason="test")
            svc.transition(job_id, "STARTING", expected_from="ADMITTED", reason="test")
        secret = bootstrap_secret(self.settings.signing_key(), job_id, 1)
        r = self.client.post(
            f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"}
        )
        assert r.status_code == 200, r.text
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        self.report(job_id, headers, progress={"step": 0, "total_steps": 3})
        return headers

    def report(self, job_id: str, headers: dict[str, str], **items: Any) -> None:
        seq = self.seq.get(job_id, 0)
        r = self.client.post(
            f"/v1/internal/jobs/{job_id}/report",
            json={"attempt": 1, "seq": seq, "phase": "running", **items},
            headers=headers,
        )
        assert r.status_code == 200, r.text
        self.seq[job_id] = seq + 1

    def step(
        self, job_id: str, headers: dict[str, str], index: int, t: float, *, events: list | None = None
    ) -> None:
        """Step `index` (from 0) as the driver reports it: its metrics under `index`, progress `index + 1`,
        then the evaluation after it under `index + 1`."""
        metrics = [{"step": index, "name": n, "value": 0.1 * (index + 1) + k, "time": t} for k, n in
                   enumerate(STEP_METRICS)]  # fmt: skip
        metrics.append({"step": index + 1, "name": "eval/arith", "value": 0.5 + index, "time": t + 0.01})
        self.report(
            job_id,
            headers,
            progress={"step": index + 1, "total_steps": 3},
            metrics=metrics,
            events=events or [],
        )

    def finish(self, job_id: str) -> None:
        with self.db.session() as s:
            JobLifecycle(s).transition(
                job_id, "SUCCEEDED", expected_from="RUNNING", reason="the driver exited 0"
            )


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The app over a migrated SQLite database with pool `local` of 2 CPU slots, served on a free port, and
    `relaxctl` talking to it with the admin key, printing to an 80-column console."""
    url = f"sqlite:///{tmp_path / 'relax.db'}"
    upgrade(url)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    db = Database(url)
    key = bootstrap(db, tmp_path)
    broker = make_broker_app(settings.broker_url, tmp_path)
    app = create_app(settings, db=db, dispatcher=CeleryDispatcher(broker))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    monkeypatch.setenv("RELAX_URL", url)
    monkeypatch.setenv("RELAX_API_KEY", key)
    monkeypatch.setattr(commands, "out", Console(width=80, no_color=True))
    monkeypatch.setattr(commands, "err", Console(width=80, stderr=True, no_color=True))
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            yield Api(client, settings, db)
    finally:
        server.should_exit = True
        thread.join(10)
        db.dispose()


def run(*argv: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli.app, list(argv))
    assert result.exit_code == code, result.output
    return result.output


def fits(output: str, width: int = 80) -> None:
    """No line is wider than the terminal, but for a path, left whole for the terminal to wrap (and copy)."""
    too_long = [
        line for line in output.splitlines() if len(line) > width and not line.startswith("  outputs: /")
    ]
    assert not too_long, too_long


def row(output: str, first: str) -> list[str]:
    """The cells of the table row that starts with `first`."""
    (line,) = [line for line in output.splitlines() if line.startswith(first + " ")]
    return line.split()


def test_jobs_list_at_80_columns_keeps_ids_and_names_whole(api: Api) -> None:
    ids = [api.submit(name) for name in NAMES]
    api.start(ids[0])
    text = run("jobs", "list")
    fits(text)
    for job_id, name in zip(ids, NAMES, strict=True):
        assert row(text, job_id)[1] == name
    assert row(text, ids[0])[2:4] == ["RUNNING", "0/3"] and row(text, ids[1])[2] == "QUEUED"
    assert "…" not in text
    assert "not shown at 80 columns:" in text and "--wide" in text

    wide = run("jobs", "list", "--wide")
    header = wide.splitlines()[0].split()
    assert header[:6] == ["id", "name", "status", "step", "slots", "queue"]
    assert row(wide, ids[1])[4:6] == ["1", "CPU"]  # the pool's slots are CPU slots
    assert "default" in row(wide, ids[1]) and "not shown" not in wide

    data = json.loads(run("jobs", "list", "--json"))
    assert [j["id"] for j in data["data"]] == ids[::-1] and data["data"][0]["total_gpus"] == 1


def test_metrics_at_80_columns_tell_names_apart_and_count_steps_as_the_log(api: Api) -> None:
    job = api.submit(NAMES[0])
    h = api.start(job)
    now = time.time()
    for i in range(2):
        api.step(job, h, i, now + i)
    text = run("metrics", NAMES[0])  # by name, as by id
    fits(text)
    assert "…" not in text
    raw, std = row(text, "rollout/raw_reward"), row(text, "rollout/raw_reward_std")
    assert raw[0] == "rollout/raw_reward" and std[0] == "rollout/raw_reward_std"
    # the columns: metric, last, step (the log's numbering: the driver logged `step 2/3` for stored step 1)
    assert raw[1:3] == ["0.2", "2"] and std[1:3] == ["1.2", "2"]
    assert row(text, "eval/arith")[1:3] == ["1.5", "2"]  # the evaluation after 2 steps: stored as 2
    assert run("metrics", job) == text

    wide = run("metrics", job, "--wide")
    assert wide.splitlines()[0].split() == ["metric", "last", "step", "first", "min", "max", "points"]
    assert row(wide, "train/loss")[1:] == ["3.2", "2", "3.1", "3.1", "3.2", "2"]
    series = json.loads(run("metrics", job, "--json"))
    assert [p["step"] for p in series["train/loss"]] == [0, 1]  # the API's data, unchanged


def test_pools_queues_and_a_job_say_cpu_slots(api: Api) -> None:
    job = api.submit(NAMES[0])
    api.start(job)
    pools = run("pools")
    fits(pools)
    assert pools.splitlines()[0].split()[:3] == ["pool", "node", "used/slots"]
    assert row(pools, "local")[:4] == ["local", "node-0", "0/2", "CPU"]  # started here without allocating
    assert row(run("pools", "--wide"), "local")[-2:] == ["cpu", "http://127.0.0.1:9"]
    queues = run("queues")
    fits(queues)
    assert row(queues, "default")[1:4] == ["local", "default", "1/2"] and "CPU" in row(queues, "default")
    got = run("jobs", "get", job)
    assert "1 CPU slot ·" in got and "GPU" not in got
    assert "GPU" not in pools + queues


def test_wait_prints_steps_and_events_in_the_order_they_happened(api: Api) -> None:
    """A finished job's stream sends everything in one poll, events first; --wait (here `jobs watch`) prints
    by time: each step's line after the checkpoint saved during it and before the one saved after it, the
    evaluation after the step, the final transition last; steps counted 1/3 … 3/3 as in the log, checkpoint
    events' steps too."""
    job = api.submit("ordered")
    h = api.start(job)
    t0 = time.time()
    for i in range(3):
        # the driver saves during the step (before reporting its metrics) and evaluates after it
        api.step(job, h, i, t0 + 0.2 * i + 0.1, events=[
            {"time": t0 + 0.2 * i + 0.05, "kind": "checkpoint_saved",
             "message": f"step {i}: /o/ckpt/iter_000000{i} (10 B)"}])  # fmt: skip
    api.report(job, h, events=[{"time": t0 + 0.7, "kind": "finished", "message": "3 steps"}])
    time.sleep(max(0.0, t0 + 0.8 - time.time()))
    api.finish(job)
    text = run("jobs", "watch", job, code=0)
    lines = [
        " ".join(line.split()[1:]) for line in text.splitlines() if re.match(r"  \d\d:\d\d:\d\d  ", line)
    ]
    order = [
        line for line in lines if line.startswith(("step", "eval", "checkpoint_saved", "finished", "RUNNING"))
    ]
    assert order == [
        "checkpoint_saved step 1/3: /o/ckpt/iter_0000000 (10 B)",
        "step 1/3 reward 2.1 loss 3.1 step_time 4.10s",
        "eval after step 1/3 arith 0.5",
        "checkpoint_saved step 2/3: /o/ckpt/iter_0000001 (10 B)",
        "step 2/3 reward 2.2 loss 3.2 step_time 4.20s",
        "eval after step 2/3 arith 1.5",
        "checkpoint_saved step 3/3: /o/ckpt/iter_0000002 (10 B)",
        "step 3/3 reward 2.3 loss 3.3 step_time 4.30s",
        "eval after step 3/3 arith 2.5",
        "finished 3 steps",
        "RUNNING → SUCCEEDED the driver exited 0",
    ], text
    assert "SUCCEEDED in" in text and "3/3 steps" in text
    # a checkpoint's event names its step as the log does (the driver sends its index from 0, as its folder)
    got = " ".join(run("jobs", "get", job).split())
    assert "checkpoint_saved step 1/3: /o/ckpt/iter_0000000 (10 B)" in got
    fits(text)


def test_submit_wait_follows_a_live_job_in_order(api: Api) -> None:
    """`submit --wait` while a driver reports (another thread), each report a step's metrics and a checkpoint
    saved just after them: the stream sends the checkpoint event first in its poll, --wait prints it after
    the step's line and its evaluation, as it happened, and a step's line comes while the job runs."""
    seen_running: list[str] = []

    def driver() -> None:
        deadline = time.time() + 20
        while not api.client.get("/v1/jobs").json()["data"] and time.time() < deadline:
            time.sleep(0.05)
        (job,) = api.client.get("/v1/jobs").json()["data"]
        h = api.start(job["id"])
        for i in range(3):
            t = time.time()
            saved = [{"time": t + 0.05, "kind": "checkpoint_saved", "message": f"after {i + 1}"}]
            api.step(job["id"], h, i, t, events=saved)
            time.sleep(0.8)
        seen_running.append(api.client.get(f"/v1/jobs/{job['id']}").json()["status"])
        api.finish(job["id"])

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    text = run("submit", "--name", "live", "--wait", "--", *_flags(grpo_spec()))
    thread.join(30)
    assert seen_running == ["RUNNING"]
    shown = [m.group(1) for m in re.finditer(r"\d  (step \d/3|eval after step \d/3|checkpoint_saved)", text)]
    assert shown == [
        *("step 1/3", "eval after step 1/3", "checkpoint_saved"),
        *("step 2/3", "eval after step 2/3", "checkpoint_saved"),
        *("step 3/3", "eval after step 3/3", "checkpoint_saved"),
    ], text
    assert text.index("RUNNING → SUCCEEDED") > text.rindex("checkpoint_saved")


def _flags(spec: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in spec.items():
        if v is True:
            out.append(f"--{k}")
        else:
            out += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


def test_admin_and_validate_name_slots_by_their_pool(api: Api) -> None:
    """A GPU pool's slots are GPUs, the CPU pool's CPU slots: in what the admin commands and the dry run say."""
    assert "pool big: 8 GPUs on 1 node(s)" in run(
        "admin", "create-pool", "big", "--accelerator", "h200", "--node", "n1:8"
    )
    assert "node node-1 of pool local: 4 CPU slots" in run(
        "admin", "set-node", "local", "node-1", "--slots", "4"
    )
    assert "node n2 of pool big: 1 GPU" in run("admin", "set-node", "big", "n2", "--gpus", "1")
    made = run("admin", "create-queue", "q2", "--pool", "local", "--team", "default", "--nominal-gpus", "1")
    assert "queue q2 of team default in pool local: nominal 1 CPU slot" in made
    checked = " ".join(run("spec", "validate", "--", *_flags(grpo_spec())).split())
    assert "valid · would queue in default on pool local · demand: 1 CPU slot(s)" in checked
    assert "GPU" not in checked
    rows = [line.split()[:4] for line in run("pools").splitlines()[1:]]
    assert ["big", "n1", "0/8", "GPU"] in rows and ["local", "node-1", "0/4", "CPU"] in rows


def test_a_name_wider_than_the_terminal_folds_whole(api: Api) -> None:
    """A name of 100 characters (the most a job's may have) at 80 columns: every column that can give way
    does, and the name folds onto the next lines rather than being cut; the id stays on one line."""
    long = "grpo-" + "x" * 90 + "-end"
    job = api.submit(long)
    text = run("jobs", "list")
    fits(text)
    assert "…" not in text
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith(job + " "))
    more = [line.split()[0] for line in lines[at + 1 :] if line.startswith(" " * len(job))]
    assert lines[at].split()[2] == "QUEUED" and [lines[at].split()[1], *more] != [long]
    assert "".join([lines[at].split()[1], *more]) == long
