"""Stream fan-out: many concurrent subscribers of one job's `GET /v1/jobs/{id}/stream`, each checked for every row.

    python -m bench.stream_fanout [--subscribers 200] [--metrics 11721] [--logs 2000] [--steps 300]
                                  [--scenarios finished,running] [--write-seconds 20] [--json]

Starts the API as production runs it (`uvicorn api.app:create_app --factory`, one worker) on a fresh SQLite
database in a temp home, submits one GRPO job, then per scenario:

- `finished`: the job's rows are written first (`--metrics` points over `--steps` steps, `--logs` log lines, a
  checkpoint, rollout and prediction every 10 steps, a driver event a step), the job is cancelled, and then
  every subscriber connects at once and reads its stream to `end`;
- `running`: every subscriber connects to the job while it is queued; the same rows are then written step by
  step over `--write-seconds` (as a driver's reports would), and the job is cancelled after the last. `end lag`
  is how long after the cancellation each subscriber had its `end`.

Each subscriber's messages are checked against the database afterwards: for each kind the row ids it received
(each message's `id` names the row's id, api/routes/jobs.py) must be exactly the job's, in order: `missed` counts
rows absent, `dup` rows received twice, `bad` subscribers with either or without `end`. The server's CPU is read
from /proc; the subscribers run in this process (asyncio, httpx), their CPU is shown apart. Exit status 1 when
any subscriber missed or repeated a row. Measured numbers: docs/stream.md ("Many subscribers").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.db.models import Checkpoint, Job, JobEvent, LogLine, Metric, Prediction, Rollout
from tests.factories import bootstrap, grpo_spec

#: Each row kind of the stream: its letter in a message id (its position there) and its table.
KINDS: dict[str, tuple[int, type[Any]]] = {
    "event": (0, JobEvent),
    "metric": (1, Metric),
    "log": (2, LogLine),
    "checkpoint": (3, Checkpoint),
    "rollout": (4, Rollout),
    "prediction": (5, Prediction),
}
METRIC_NAMES = 40  # a GRPO step reports about this many (rollout/*, train/*, perf/*)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    key: str
    db: Database

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.db.dispose()


def start_server(home: Path) -> Server:
    """The API on a fresh SQLite database under `home`, bootstrapped as the tests do (tests/factories.py)."""
    url = f"sqlite:///{home / 'relax.db'}"
    upgrade(url)
    db = Database(url)
    key = bootstrap(db, home)
    port = _free_port()
    env = {**os.environ, "RELAX_HOME": str(home), "RELAX_DATABASE_URL": url, "RELAX_LOG_FORMAT": "text"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--port", str(port)]
        + ["--log-level", "warning", "--no-access-log"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(home / "api.log", "wb"),  # noqa: SIM115 - the child's, closed with it
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):
                return Server(proc, base, key, db)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the API did not start; see {home / 'api.log'}")


def write_step(db: Database, job_id: str, step: int, metrics: int, logs: int) -> None:
    """One step's rows, as one report of the driver stores them."""
    now = datetime.now(UTC)
    with db.session() as s:
        # as `JobReports.ingest_report`: the report moves the job's row first (`report_seq`, progress)
        s.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(report_seq=Job.report_seq + 1, last_report_at=now, progress_step=step + 1)
        )
        if metrics:
            s.execute(
                sa.insert(Metric),
                [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "step": step,
                        "name": f"train/m{i % METRIC_NAMES}",
                        "value": float(i),
                        "time": now,
                    }
                    for i in range(metrics)
                ],
            )
        if logs:
            s.execute(
                sa.insert(LogLine),
                [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "time": now,
                        "level": "INFO",
                        "source": "driver",
                        "message": f"step {step}: line {i}",
                    }
                    for i in range(logs)
                ],
            )
        s.add(JobEvent(job_id=job_id, kind="driver", reason=f"step {step} done"))
        if step % 10 == 0:
            s.add(
                Checkpoint(
                    job_id=job_id,
                    attempt=1,
                    step=step,
                    path=f"/ckpt/iter_{step:07d}",
                    size_bytes=1,
                    format="torch",
                    time=now,
                )
            )
            s.add(
                Rollout(
                    job_id=job_id,
                    attempt=1,
                    rollout_id=step,
                    split="train",
                    path=f"/rollouts/{step}.jsonl",
                    num_samples=8,
                    time=now,
                )
            )
            s.add(
                Prediction(
                    job_id=job_id,
                    attempt=1,
                    step=step,
                    path=f"/predict/{step}.jsonl",
                    num_samples=4,
                    time=now,
                )
            )


def _spread(total: int, parts: int, i: int) -> int:
    return total // parts + (1 if i < total % parts else 0)


def write_job(
    db: Database,
    job_id: str,
    args: argparse.Namespace,
    *,
    seconds: float = 0.0,
    probe: Callable[[], None] | None = None,
) -> None:
    started = time.monotonic()
    for step in range(args.steps):
        write_step(
            db, job_id, step, _spread(args.metrics, args.steps, step), _spread(args.logs, args.steps, step)
        )
        if probe is not None and step % 10 == 0:
            probe()
        if seconds:
            time.sleep(max(0.0, started + seconds * (step + 1) / args.steps - time.monotonic()))


@dataclass
class Received:
    rows: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in KINDS})
    messages: int = 0
    ended_at: float | None = None
    error: str | None = None


def parse(body: bytes, got: Received) -> None:
    for message in body.split(b"\n\n"):
        if not message or message.startswith(b":"):
            continue
        msg_id = kind = None
        for line in message.split(b"\n"):
            if line.startswith(b"id: "):
                msg_id = line[4:]
            elif line.startswith(b"event: "):
                kind = line[7:].decode()
        got.messages += 1
        if kind in KINDS and msg_id is not None:
            got.rows[kind].append(int(msg_id.split(b".")[KINDS[kind][0]][1:]))


async def subscribe(client: httpx.AsyncClient, job_id: str, connected: asyncio.Event | None) -> Received:
    got = Received()
    chunks: list[bytes] = []
    try:
        async with client.stream("GET", f"/v1/jobs/{job_id}/stream") as r:
            r.raise_for_status()
            if connected is not None:
                connected.set()
            async for chunk in r.aiter_bytes():
                chunks.append(chunk)
        got.ended_at = time.monotonic() if b"event: end\n" in b"".join(chunks[-2:]) else None
    except Exception as exc:  # noqa: BLE001 - counted as a failed subscriber
        got.error = f"{type(exc).__name__}: {exc}"
    parse(b"".join(chunks), got)
    return got


def stored(db: Database, job_id: str) -> dict[str, list[int]]:
    with db.session(read_only=True) as s:
        return {
            kind: list(s.scalars(sa.select(t.id).where(t.job_id == job_id).order_by(t.id)))
            for kind, (_, t) in KINDS.items()
        }


def run_scenario(server: Server, name: str, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=headers) as http:
        job = http.post("/v1/jobs", json={"name": f"fanout-{name}", "spec": grpo_spec()}).json()
        job_id = job["id"]

        def cancel() -> float:
            http.post(f"/v1/jobs/{job_id}/cancel", timeout=60).raise_for_status()
            return time.monotonic()

        probes: list[float] = []

        def probe() -> None:  # another client's request while the streams run: it must not wait behind them
            t = time.monotonic()
            http.get(f"/v1/jobs/{job_id}", timeout=60).raise_for_status()
            probes.append(time.monotonic() - t)

        if name == "finished":
            write_job(server.db, job_id, args)
            cancel()
        cancelled: list[float] = []
        finished: list[float] = []  # when the last subscriber had its end

        async def main() -> list[Received]:
            limits = httpx.Limits(max_connections=args.subscribers + 10, max_keepalive_connections=0)
            timeout = httpx.Timeout(30, read=300)
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, limits=limits, timeout=timeout
            ) as client:
                connected = [asyncio.Event() for _ in range(args.subscribers)]
                tasks = [asyncio.create_task(subscribe(client, job_id, ev)) for ev in connected]
                if name == "running":
                    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in connected)), 120)

                    def writer() -> None:
                        write_job(server.db, job_id, args, seconds=args.write_seconds, probe=probe)
                        cancelled.append(cancel())

                    thread = threading.Thread(target=writer, daemon=True)
                    thread.start()
                else:
                    thread = threading.Thread(target=lambda: [probe() or time.sleep(0.5) for _ in range(10)])
                    thread.start()
                got = list(await asyncio.gather(*tasks))
                finished.append(time.monotonic())
                await asyncio.to_thread(thread.join)
                return got

        cpu0, client0, t0 = _cpu_s(server.proc.pid), time.process_time(), time.monotonic()
        results = asyncio.run(main())
        wall = finished[0] - t0
        server_cpu, client_cpu = _cpu_s(server.proc.pid) - cpu0, time.process_time() - client0
    want = stored(server.db, job_id)
    rows = sum(len(v) for v in want.values())
    missed = dup = bad = 0
    for got in results:
        m = sum(len(set(want[k]) - set(got.rows[k])) for k in KINDS)
        d = sum(len(got.rows[k]) - len(set(got.rows[k])) for k in KINDS)
        out_of_order = any(got.rows[k] != sorted(got.rows[k]) for k in KINDS)
        missed, dup = missed + m, dup + d
        bad += bool(m or d or out_of_order or got.error or got.ended_at is None)
    lags = sorted(g.ended_at - cancelled[0] for g in results if g.ended_at is not None and cancelled)
    return {
        "scenario": name,
        "subscribers": args.subscribers,
        "rows_each": rows,
        "messages": sum(g.messages for g in results),
        "wall_s": round(wall, 2),
        "rows_per_s": round(rows * args.subscribers / wall),
        "server_cpu_s": round(server_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "probe_p50_ms": round(1000 * sorted(probes)[len(probes) // 2]) if probes else None,
        "probe_max_ms": round(1000 * max(probes)) if probes else None,
        "end_lag_p50_s": round(lags[len(lags) // 2], 2) if lags else None,
        "end_lag_max_s": round(lags[-1], 2) if lags else None,
        "missed": missed,
        "dup": dup,
        "bad": bad,
        "errors": sorted({g.error for g in results if g.error})[:3],
    }


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="relax-fanout-") as tmp:
        server = start_server(Path(tmp))
        try:
            return [run_scenario(server, name, args) for name in args.scenarios.split(",")]
        finally:
            server.stop()


#: Table columns that show two numbers (p50/max).
_PAIRS = {"end_lag": ("end_lag_p50_s", "end_lag_max_s"), "probe": ("probe_p50_ms", "probe_max_ms")}


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("scenario", "scenario"),
        ("subs", "subscribers"),
        ("rows each", "rows_each"),
        ("wall s", "wall_s"),
        ("rows/s", "rows_per_s"),
        ("server CPU s", "server_cpu_s"),
        ("client CPU s", "client_cpu_s"),
        ("end lag p50/max s", "end_lag"),
        ("GET job p50/max ms", "probe"),
        ("missed", "missed"),
        ("dup", "dup"),
        ("bad", "bad"),
    ]
    cells = [
        [
            str(r[k])
            if k not in _PAIRS
            else (f"{r[_PAIRS[k][0]]}/{r[_PAIRS[k][1]]}" if r[_PAIRS[k][1]] is not None else "-")
            for _, k in cols
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(cols)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(cols, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", type=int, default=200)
    p.add_argument(
        "--metrics", type=int, default=11_721, help="metric points of the job (the issue's GRPO job)"
    )
    p.add_argument("--logs", type=int, default=2_000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--scenarios", default="finished,running")
    p.add_argument("--write-seconds", type=float, default=20.0, help="how long `running` writes its rows")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = bench(args)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    for r in rows:
        for e in r["errors"]:
            print(f"{r['scenario']}: {e}", file=sys.stderr)
    return 1 if any(r["missed"] or r["dup"] or r["bad"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
