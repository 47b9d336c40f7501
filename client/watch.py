"""Follows one job to its end for `relaxctl submit --wait`: transitions, per-step metrics, progress.

What it prints comes in the order it happened. The stream sends what is new at each of its polls grouped by
kind (the status, then events, then metric points, then log lines), so within one poll a checkpoint event of
step 3 comes before the metrics of step 3 that were reported before it. Everything is therefore held for a
moment (`HOLD_S`, longer than the stream's poll) and printed by its own time; a step's line is printed once
the step's metrics are all in (a later step's arrive, or none came for `HOLD_S`). Steps are numbered as the
job's log numbers them (`step 1/300` … `step 300/300`), see `client.display.log_step`."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from client.display import EVAL_PREFIX, event_reason, log_step
from client.sdk import ApiError, RelaxClient, sse_messages
from wire.jobs import JobStatus

HEADLINE = ("rollout/reward", "train/loss", "eval/loss", "perf/step_time")
#: Seconds an item waits before it is printed, for anything that happened before it to arrive: longer than
#: the stream's poll interval (0.5 s, api/routes/jobs.py), since one poll's items arrive together.
HOLD_S = 1.0


def _fmt(name: str, value: float) -> str:
    short = name.split("/", 1)[-1]
    if name.startswith("perf/") and name.endswith("_time"):
        return f"{short} {value:.2f}s"
    return f"{short} {value:.4g}"


def _time(iso: str) -> datetime:
    """An API time (naive ones are UTC, as SQLite gives them back)."""
    t = datetime.fromisoformat(iso)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _eval_headline(name: str) -> bool:
    """An evaluation's main number: `eval/<dataset>` (its reward) and SFT's `eval/loss`, not the details
    (`eval/<dataset>/response_len`, `eval/<dataset>-truncated_ratio`, `eval/num_tokens`)."""
    rest = name[len(EVAL_PREFIX) :]
    return name.startswith(EVAL_PREFIX) and "/" not in rest and "-" not in rest and rest != "num_tokens"


@dataclass
class _Line:
    """A step's metric points (or an evaluation's), until they are all in."""

    eval: bool
    step: int
    time: datetime
    received: float
    values: dict[str, float] = field(default_factory=dict)


class Timeline:
    """Orders what --wait prints by when it happened (see the module's docstring)."""

    def __init__(self, console: Console, hold_s: float = HOLD_S) -> None:
        self.console = console
        self.hold_s = hold_s
        self.total: int | None = None
        self.pending: list[tuple[datetime, int, float, str]] = []  # (time, arrival, received, text)
        self.open: dict[bool, _Line] = {}  # eval? -> its open line
        self.arrivals = 0
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}

    # -- what comes in ---------------------------------------------------------------------------------------
    def event(self, data: dict[str, Any]) -> None:
        what = (
            f"{data['from_status'] or '·'} → {data['to_status']}"
            if data["kind"] == "transition"
            else data["kind"]
        )
        reason = event_reason(data["kind"], data.get("reason"), self.total)
        self._add(_time(data["time"]), f"{what:<24} {escape(reason)}".rstrip())

    def log(self, data: dict[str, Any]) -> None:
        self._add(_time(data["time"]), f"[red]{escape(data['message'])}[/red]")

    def metric(self, point: dict[str, Any], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        name, value = point["name"], float(point["value"])
        is_eval = name.startswith(EVAL_PREFIX)
        step = log_step(name, int(point["step"]))
        line = self.open.get(is_eval)
        if line is not None and line.step != step:
            self._close(line)
            line = None
        if line is None:
            line = self.open[is_eval] = _Line(is_eval, step, _time(point["time"]), now)
        line.values[name] = value
        line.received = now
        self.first.setdefault(name, value)
        self.last[name] = value

    # -- what goes out ---------------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Print what has waited long enough and has nothing earlier still to come."""
        now = time.monotonic() if now is None else now
        for line in list(self.open.values()):
            if now - line.received >= self.hold_s:
                self._close(line)
        self.pending.sort()
        earliest_open = min((line.time for line in self.open.values()), default=None)
        while self.pending:
            t, _, received, text = self.pending[0]
            if now - received < self.hold_s or (earliest_open is not None and t > earliest_open):
                break
            self.pending.pop(0)
            self._print(t, text)

    def flush(self) -> None:
        """Print everything still held, in order (the stream ended)."""
        for line in list(self.open.values()):
            self._close(line)
        for t, _, _, text in sorted(self.pending):
            self._print(t, text)
        self.pending = []

    def headline(self) -> str:
        parts = []
        for n in ("rollout/reward", "train/loss"):
            if n in self.first:
                parts.append(f"{n} {self.first[n]:.3g} → {self.last[n]:.3g}")
        return " · ".join(parts)

    # -- inside ----------------------------------------------------------------------------------------------
    def _add(self, t: datetime, text: str, received: float | None = None) -> None:
        self.arrivals += 1
        self.pending.append((t, self.arrivals, time.monotonic() if received is None else received, text))

    def _steps(self, step: int) -> str:
        return f"{step}/{self.total}" if self.total else str(step)

    def _close(self, line: _Line) -> None:
        del self.open[line.eval]
        if line.eval:
            shown = [_fmt(n, v) for n, v in sorted(line.values.items()) if _eval_headline(n)]
            where = f"after step {self._steps(line.step)}" if line.step else "before step 1"
            text = f"eval {where}  " + "  ".join(shown) if shown else ""
        else:
            shown = [_fmt(n, line.values[n]) for n in HEADLINE if n in line.values]
            text = f"step {self._steps(line.step):<9} " + "  ".join(shown) if shown else ""
        if text:
            self._add(line.time, text, received=line.received)

    def _print(self, t: datetime, text: str) -> None:
        """`  HH:MM:SS  text`, a long text wrapping under itself."""
        line = Table.grid(padding=(0, 0, 0, 2), pad_edge=True)
        line.add_column(no_wrap=True, style="dim")
        line.add_column(overflow="fold")
        line.add_row(f"{t.astimezone(UTC):%H:%M:%S}", Text.from_markup(text))
        self.console.print(line, highlight=False)


def follow(
    client: RelaxClient,
    job_id: str,
    *,
    kinds: Sequence[str] | None = None,
    after: str | None = None,
    retries: int = 30,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The job's stream (`GET /v1/jobs/{id}/stream`) from its start, or after the message id `after`, to its
    `end`: (kind, data) of each message, each once. A dropped connection is resumed after the last id
    received (`Last-Event-ID`), which the server answers exactly: nothing repeated, nothing lost. `kinds`
    keeps only those kinds of rows (`status` and `end` always come). Gives up after `retries` failed
    connections in a row; a 401, 403 or 404 is raised at once."""
    last, failures = after, 0
    params = {"kinds": list(kinds)} if kinds else None
    while True:
        headers = {"Last-Event-ID": last} if last else {}
        try:
            with client._http.stream(  # noqa: SLF001 - the SDK's connection (its key and base URL)
                "GET",
                f"/v1/jobs/{job_id}/stream",
                params=params,
                headers=headers,
                timeout=httpx.Timeout(30, read=120),
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ApiError.of(resp)
                # a message's id counts once the message is whole (a cut one is sent again)
                for kind, msg_id, data in sse_messages(resp.iter_lines()):
                    last, failures = msg_id or last, 0
                    yield kind, data
                    if kind == "end":
                        return
            failures += 1  # closed before its end (a server going down): resumed like a failure
            if failures > retries:
                raise ApiError(0, "stream_closed", f"the stream of job {job_id} kept closing before its end")
        except (httpx.HTTPError, ApiError) as err:
            failures += 1
            if failures > retries or (isinstance(err, ApiError) and err.status in (0, 401, 403, 404)):
                raise
        time.sleep(1.0)


def _read(client: RelaxClient, job_id: str, out: queue.Queue[tuple[str, Any]]) -> None:
    """The stream's messages into `out`, each once (a reconnect resumes after the last message received),
    then ("done", status) at the job's end or ("error", exception)."""
    try:
        for kind, data in follow(client, job_id):
            if kind == "end":
                break
            out.put((kind, data))
        status = client.get_job(job_id)["status"]
    except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
        out.put(("error", err))
        return
    out.put(("done", status))


def watch_job(client: RelaxClient, job_id: str, console: Console) -> str:
    """Print the job's life until it ends; returns its final status."""
    lines = Timeline(console)
    started = time.time()
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task("job", total=None, status=JobStatus.QUEUED.value, info="")
    messages: queue.Queue[tuple[str, Any]] = queue.Queue()
    threading.Thread(
        target=_read, args=(client, job_id, messages), name="relaxctl-watch", daemon=True
    ).start()
    with progress:
        while True:
            try:
                kind, data = messages.get(timeout=0.2)
            except queue.Empty:
                lines.tick()
                continue
            if kind == "error":
                raise data
            if kind == "done":
                break
            if kind == "status":
                if data.get("total_steps"):
                    lines.total = data["total_steps"]
                    progress.update(task, total=data["total_steps"], completed=data.get("progress_step") or 0)
                info = data.get("wait_reason") if data["status"] == JobStatus.QUEUED else ""
                progress.update(task, status=data["status"], info=info or "")
            elif kind == "event":
                lines.event(data)
            elif kind == "metric":
                lines.metric(data)
            elif kind == "log" and data.get("level") in ("ERROR", "CRITICAL"):
                lines.log(data)
            lines.tick()
    lines.flush()
    job = client.get_job(job_id)
    elapsed = time.time() - started
    status = job["status"]
    color = "green" if status == JobStatus.SUCCEEDED else "red" if status == JobStatus.FAILED else "yellow"
    summary = [f"[{color}]{job['status']}[/{color}] in {elapsed:.0f}s"]
    if job.get("total_steps"):
        summary.append(f"{job.get('progress_step') or 0}/{job['total_steps']} steps")
    if lines.headline():
        summary.append(lines.headline())
    try:
        ckpts = client.checkpoints(job_id)
        if ckpts:
            summary.append(f"{len(ckpts)} checkpoint(s)")
    except ApiError:
        pass
    console.print(" · ".join(summary), highlight=False)
    if job["status"] == JobStatus.FAILED:
        console.print(f"  reason: {escape(job.get('status_reason') or '')}", highlight=False)
        console.print(f"  logs:   relaxctl jobs logs {job_id}")
    console.print(f"  outputs: {job['output_dir']}", highlight=False, soft_wrap=True)
    return str(job["status"])
