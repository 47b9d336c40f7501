"""Follows one job to its end for `relaxctl submit --wait`: transitions, per-step metrics, progress."""

from __future__ import annotations

import time
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

from client.sdk import ApiError, RelaxClient

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
HEADLINE = ("rollout/reward", "train/loss", "eval/reward", "perf/step_time")


def _fmt(name: str, value: float) -> str:
    short = name.split("/", 1)[-1]
    if name.startswith("perf/") and name.endswith("_time"):
        return f"{short} {value:.2f}s"
    return f"{short} {value:.4g}"


class _StepLines:
    """Collects metric points per step and prints one line per finished step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.step: int | None = None
        self.values: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def add(self, point: dict[str, Any]) -> None:
        step = int(point["step"])
        if self.step is not None and step > self.step:
            self.flush()
        self.step = step
        self.values[point["name"]] = point["value"]
        self.first.setdefault(point["name"], point["value"])
        self.last[point["name"]] = point["value"]

    def flush(self) -> None:
        if self.step is None or not self.values:
            return
        shown = [_fmt(n, self.values[n]) for n in HEADLINE if n in self.values]
        if shown:
            self.console.print(f"  step {self.step:>4}  " + "  ".join(shown), highlight=False)
        self.values = {}

    def headline(self) -> str:
        parts = []
        for n in ("rollout/reward", "train/loss"):
            if n in self.first:
                parts.append(f"{n} {self.first[n]:.3g} → {self.last[n]:.3g}")
        return " · ".join(parts)


def watch_job(client: RelaxClient, job_id: str, console: Console) -> str:
    """Print the job's life until it ends; returns its final status."""
    lines = _StepLines(console)
    status = "QUEUED"
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
    task = progress.add_task("job", total=None, status=status, info="")
    failures = 0
    with progress:
        while status not in TERMINAL:
            try:
                for kind, data in client.stream(job_id):
                    failures = 0
                    if kind == "status":
                        status = data["status"]
                        if data.get("total_steps"):
                            progress.update(
                                task, total=data["total_steps"], completed=data.get("progress_step") or 0
                            )
                        info = data.get("wait_reason") if status == "QUEUED" else ""
                        progress.update(task, status=status, info=info or "")
                    elif kind == "event":
                        what = (
                            f"{data['from_status'] or '·'} → {data['to_status']}"
                            if data["kind"] == "transition"
                            else data["kind"]
                        )
                        console.print(
                            f"  [dim]{data['time'][11:23]}[/dim]  {what:<24} {escape(data.get('reason') or '')}",
                            highlight=False,
                        )
                    elif kind == "metric":
                        lines.add(data)
                    elif kind == "log" and data.get("level") in ("ERROR", "CRITICAL"):
                        console.print(f"  [red]{escape(data['message'])}[/red]", highlight=False)
                    elif kind == "end":
                        break
            except (httpx.HTTPError, ApiError) as err:
                failures += 1
                if failures > 30 or (isinstance(err, ApiError) and err.status in (401, 403, 404)):
                    raise
                time.sleep(1.0)
                continue
            status = client.get_job(job_id)["status"]
    lines.flush()
    job = client.get_job(job_id)
    elapsed = time.time() - started
    color = {"SUCCEEDED": "green", "FAILED": "red"}.get(job["status"], "yellow")
    summary = [f"[{color}]{job['status']}[/{color}] in {elapsed:.0f}s"]
    if lines.headline():
        summary.append(lines.headline())
    try:
        ckpts = client.checkpoints(job_id)
        if ckpts:
            summary.append(f"{len(ckpts)} checkpoint(s)")
    except ApiError:
        pass
    console.print(" · ".join(summary), highlight=False)
    if job["status"] == "FAILED":
        console.print(f"  reason: {escape(job.get('status_reason') or '')}", highlight=False)
        console.print(f"  logs:   relaxctl jobs logs {job_id}")
    console.print(f"  outputs: {job['output_dir']}", highlight=False)
    return str(job["status"])
