"""`relaxctl`: the command line of Relax Platform (reads RELAX_URL and RELAX_API_KEY)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from client.display import (
    Col,
    event_reason,
    full_time,
    log_step,
    pool_kinds,
    print_table,
    short_time,
    slot_kind,
    slots,
    slots_phrase,
)
from client.jobfile import JobFile, JobFileError, is_launch_script, load_job_file
from client.launch_script import DEFAULT_TIMEOUT_S, LaunchScriptError, ResolvedScript
from client.sdk import ApiError, RelaxClient
from client.watch import follow as follow_stream
from client.watch import watch_job

# Typer 0.29's help panel prints a type after every option, flags included (`--wait <bool>`), as if they took a
# value: a flag (or a counter) shows none.
_option_type = typer.core.TyperOption.display_type_rich


def _flag_shows_no_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag or self.count else _option_type(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_shows_no_type  # type: ignore[method-assign]

app = typer.Typer(
    help="Relax Platform: submit and watch LLM post-training jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
jobs_app = typer.Typer(help="List, inspect and cancel jobs.", no_args_is_help=True)
spec_app = typer.Typer(help="Validate job specs and print their schema.", no_args_is_help=True)
models_app = typer.Typer(help="Build models and datasets locally (no hub needed).", no_args_is_help=True)
admin_app = typer.Typer(
    help="Teams and their grants, API keys, pools, queues, the audit log (admin key; a team admin's key "
    "manages its team's keys).",
    no_args_is_help=True,
)
app.add_typer(jobs_app, name="jobs")
app.add_typer(spec_app, name="spec")
app.add_typer(models_app, name="models")
app.add_typer(admin_app, name="admin")

out = Console()
err = Console(stderr=True)

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="RELAX_URL", help="API URL.")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="RELAX_API_KEY", help="API key.", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide", help="Every column, however wide (by default columns give way to fit the terminal)."
    ),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", help="KEY=VALUE in a launch script's environment (repeatable)."),
]
InheritEnvOpt = Annotated[
    bool,
    typer.Option(
        "--inherit-env",
        help="Run a launch script with this shell's whole environment (default: only PATH, LANG and --env).",
    ),
]
ScriptTimeoutOpt = Annotated[
    float, typer.Option("--script-timeout", help="Seconds a launch script may run here before it is stopped.")
]


def _client(url: str | None, key: str | None) -> RelaxClient:
    return RelaxClient(url, key)


JOB_ID = re.compile(r"job_[0-9a-f]{20}")
JobArg = Annotated[
    str, typer.Argument(metavar="JOB", help="The job's id, or its name where one of your jobs has it.")
]


def _job_id(c: RelaxClient, ref: str) -> str:
    """A job's id from its id, or from its name where one job of those the key can see has it."""
    if JOB_ID.fullmatch(ref):
        return ref
    try:
        named = c.list_jobs(name=ref, limit=6)["data"]
    except ApiError as e:
        _fail(e)  # raises typer.Exit
    if len(named) == 1:
        return str(named[0]["id"])
    if not named:
        err.print(
            f"[red]error[/red] no job has the id or name {escape(ref)!r} (`relaxctl jobs list` shows yours)"
        )
    else:
        err.print(
            f"[red]error[/red] {len(named)}{'+' if len(named) > 5 else ''} jobs are named {escape(ref)!r}: give the id"
        )
        for j in named[:5]:
            out.print(
                f"  {j['id']}  {j['status']:<10} {j.get('team', '')}  {j['created_at'][:19].replace('T', ' ')}"
            )
    raise typer.Exit(2)


def _fail(e: ApiError) -> None:
    err.print(f"[red]error[/red] {e.message}" + (f"  [dim]({e.code})[/dim]" if e.code else ""))
    for issue in e.issues:
        where = issue.get("field") or ""
        tag = "[yellow]warning[/yellow] " if issue.get("severity") == "warning" else ""
        err.print(f"  - {tag}[bold]{where}[/bold]: {issue.get('message', '')}")
        if issue.get("hint"):
            err.print(f"    hint: {issue['hint']}")
    raise typer.Exit(2 if e.status in (400, 409, 422) else 1)


def _print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


# ---------------------------------------------------------------------------------------------
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    file: Annotated[
        str | None,
        typer.Argument(
            help="Job file (YAML/JSON), or a Relax launch script (.sh) then `--` and its arguments; "
            "or `--` then Relax flags."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Follow the job until it ends.")] = False,
    env: EnvOpt = None,
    inherit_env: InheritEnvOpt = False,
    script_timeout: ScriptTimeoutOpt = DEFAULT_TIMEOUT_S,
    name: Annotated[str | None, typer.Option(help="Job name (overrides the file's).")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue (overrides the file's).")] = None,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="low, normal, high, or one an admin added.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmitting with the same key returns the same job.")
    ] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job from a file, from a launch script (run here by bash to find its training
    command), or from Relax flags after `--`; with --wait, follow it to the end."""
    file, args = _file_and_args(ctx, file)
    if not file and not args:
        err.print(
            "[red]error[/red] nothing to submit: `relaxctl submit FILE`, `relaxctl submit SCRIPT.sh [-- script args]` "
            "or `relaxctl submit -- --flag value ...`"
        )
        raise typer.Exit(2)
    spec: dict | None = None
    jf_name = jf_queue = None
    jf_priority_class, labels = None, {}
    flags: list[str] | str | None = args or None
    script: ResolvedScript | None = None
    if file:
        jf = _load(file, args, env, inherit_env, script_timeout)
        spec, flags, jf_name, jf_queue, jf_priority_class, labels = (
            jf.spec,
            jf.args,
            jf.name,
            jf.queue,
            jf.priority_class,
            jf.labels,
        )
        script = jf.launch_script
    elif env:
        err.print("[red]error[/red] --env is for launch scripts (.sh): give the script")
        raise typer.Exit(2)
    if script is not None and not as_json:
        _print_script(script)
    with _client(url, api_key) as c:
        try:
            job = c.submit_job(
                spec=spec,
                args=flags,
                name=name or jf_name,
                queue=queue or jf_queue,
                priority_class=priority_class or jf_priority_class,
                labels=labels,
                idempotency_key=idempotency_key,
                launch_script=script.provenance() if script else None,
            )
        except ApiError as e:
            _fail(e)
            return
        if as_json and not wait:
            _print_json(job)
            return
        out.print(
            f"submitted [bold]{job['id']}[/bold] ({job['name']}) to queue {job['queue']} on pool {job['pool']}"
        )
        if job["submitted"].get("warnings"):
            for w in job["submitted"]["warnings"]:
                out.print(f"  [yellow]warning[/yellow] {w.get('field', '')}: {w.get('message', '')}")
        if not wait:
            return
        final = watch_job(c, job["id"], out)
    raise typer.Exit(0 if final == "SUCCEEDED" else 1)


HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="Where the platform keeps its database, keys and logs (default: $RELAX_HOME or .relax).",
    ),
]


@app.command()
def up(
    port: Annotated[
        int | None, typer.Option(help="Port of the API and dashboard (default 8400, RELAX_PORT).")
    ] = None,
    home: HomeOpt = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background; `relaxctl down` stops it.")
    ] = False,
) -> None:
    """Start the embedded platform here (API, scheduler, worker, local Ray, SQLite). In the foreground
    Ctrl-C stops it; with --detach it runs on in the background, its output in <home>/logs/platform.log."""
    from client import platform

    where = platform.home_dir(home)
    state = platform.read_state(where)
    if state.running:
        err.print(
            f"[red]error[/red] a platform already runs on {where} (pid {state.pid}, {state.url or 'starting'}): "
            f"`relaxctl down --home {where}` stops it"
        )
        raise typer.Exit(1)
    if port is not None and not 1 <= port <= 65535:
        err.print(f"[red]error[/red] --port {port}: a TCP port is 1-65535")
        raise typer.Exit(2)
    if not detach:
        env = os.environ.copy() | {"RELAX_HOME": str(where)}
        if port is not None:
            env["RELAX_PORT"] = str(port)
        os.execve(sys.executable, [sys.executable, "-m", "api.embedded"], env)
    out.print(f"starting the platform on {where} (output: {where / 'logs' / 'platform.log'}) ...")
    code, state = platform.start_detached(where, port)
    if code == 0 and state.running:
        out.print(
            f"Relax Platform is up on {state.url} (pid {state.pid}, home {where})\n"
            f"  stop: relaxctl down --home {where}    status: relaxctl status --home {where}"
        )
        return
    why = (state.state or {}).get("reason") if state.state else None
    err.print(
        "[red]error[/red] the platform did not come up"
        + (f" (exit code {code})" if code > 0 else " in time" if code < 0 else "")
        + (f": {escape(str(why))}" if why else "")
        + f"; see {where / 'logs' / 'platform.log'}"
    )
    raise typer.Exit(1)


@app.command()
def down(
    home: HomeOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for it to stop.")] = 60.0,
) -> None:
    """Stop the embedded platform of this home (started by `relaxctl up`, in the foreground or detached):
    its API, worker, beat and Ray stop in order; jobs still running resume from their checkpoints next time."""
    from client import platform

    where = platform.home_dir(home)
    outcome, state = platform.stop(where, wait_s=timeout)
    if outcome == "not-running":
        out.print(f"no platform runs on {where}")
        return
    if outcome == "timeout":
        err.print(f"[red]error[/red] the platform (pid {state.pid}) is still stopping after {timeout:.0f} s")
        raise typer.Exit(1)
    out.print(f"Relax Platform on {where} stopped")


@app.command()
def status(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Is the embedded platform of this home running, is it ready, and how is each of its parts.
    Exit code 0: running and ready; 1: not running; 3: running but not ready."""
    from client import platform

    where = platform.home_dir(home)
    state = platform.read_state(where)
    ready, body = platform.readiness(state.url) if state.running and state.url else (False, "not running")
    if as_json:
        _print_json(
            {
                "home": str(where),
                "running": state.running,
                "ready": ready,
                "state": state.state,
                "readyz": body,
            }
        )
    elif not state.running:
        last = (state.state or {}).get("status")
        reason = (state.state or {}).get("reason")
        out.print(
            f"no platform runs on {where}"
            + (f" (last: {last}{', ' + escape(str(reason)) if reason else ''})" if last else "")
        )
    else:
        out.print(
            f"Relax Platform on {where}: pid {state.pid}, {state.url}, "
            + ("[green]ready[/green]" if ready else "[red]not ready[/red]")
        )
        rows = [
            [
                name,
                str(part.get("state", "")),
                str(part.get("pid") or ""),
                str(part.get("restarts", 0)),
                str(part.get("detail") or ""),
            ]
            for name, part in ((state.state or {}).get("parts") or {}).items()
        ]
        cols = [Col("part"), Col("state"), Col("pid", right=True), Col("restarts", right=True)]
        print_table(out, [*cols, Col("detail", wrap=True)], rows)
        if not ready:
            why = body.get("down") if isinstance(body, dict) else body
            out.print(f"  /readyz: [red]not ready[/red] ({escape(str(why))})")
    raise typer.Exit(0 if state.running and ready else 1 if not state.running else 3)


@app.command()
def dashboard(
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Only print the link.")] = False,
) -> None:
    """Open the web dashboard, signed in as your API key. The key itself never leaves this process: the
    link carries a one-time login code (good for one sign-in within two minutes), in the URL fragment,
    which browsers never send to a server; the dashboard exchanges it and removes it from the address."""
    import webbrowser

    with _client(url, api_key) as c:
        link = f"{c.url}/"
        if c.api_key:
            try:
                link = f"{c.url}/#code={c.login_code()['code']}"
            except ApiError as e:
                _fail(e)
                return
    out.print(link, highlight=False)
    if not no_browser:
        webbrowser.open(link)


@app.command()
def metrics(
    job_id: JobArg,
    names: Annotated[list[str] | None, typer.Option("--name", "-n", help="Only these metrics.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print every point as it comes (from the first) until the job ends: time, step, metric, "
            "value; with --json one JSON object a line.",
        ),
    ] = False,
) -> None:
    """Every metric of a job: last, first, min and max value, the step of its last point (numbered as the
    job's log numbers steps, 1 to the last; an evaluation's step is the number of steps done before it, 0
    before the first) and the number of points. --json gives the API's series unchanged, where a step's own
    metrics count steps from 0."""
    with _client(url, api_key) as c:
        job_id = _job_id(c, job_id)
        if follow:
            _follow_metrics(c, job_id, names, as_json=as_json)
            return
        try:
            series = c.metrics(job_id, names=names)
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(series)
        return
    cols = [
        Col("metric"),
        Col("last", right=True),
        Col("step", right=True),
        Col("first", drop=3, right=True),
        Col("min", drop=2, right=True),
        Col("max", drop=2, right=True),
        Col("points", drop=4, right=True),
    ]
    rows = []
    for name, pts in sorted(series.items()):
        if not pts:
            continue
        vals = [p["value"] for p in pts]
        rows.append(
            [
                name,
                f"{vals[-1]:.4g}",
                str(log_step(name, pts[-1]["step"])),
                f"{vals[0]:.4g}",
                f"{min(vals):.4g}",
                f"{max(vals):.4g}",
                str(len(pts)),
            ]
        )
    print_table(out, cols, rows, wide=wide, note=err)


def _follow_metrics(c: RelaxClient, job_id: str, names: list[str] | None, *, as_json: bool) -> None:
    """`metrics -f`: the job's stream of metric points, each once, until the job ends."""
    wanted = {n for item in names or [] for n in item.split(",") if n}
    try:
        for kind, point in follow_stream(c, job_id, kinds=["metric"]):
            if kind != "metric" or (wanted and point["name"] not in wanted):
                continue
            if as_json:
                print(json.dumps(point), flush=True)
                continue
            out.print(
                f"[dim]{point['time'][11:19]}[/dim] step {log_step(point['name'], point['step']):>6}  "
                f"{escape(point['name'])} {point['value']:.6g}",
                highlight=False,
            )
    except ApiError as e:
        _fail(e)


@app.command()
def pools(
    url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False, wide: WideOpt = False
) -> None:
    """Pools, their nodes and what is allocated on each: slots in use of the node's, GPUs or CPU slots (the
    embedded platform on a machine without GPUs schedules CPU slots)."""
    with _client(url, api_key) as c:
        try:
            data = c.pools()
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(data)
        return
    cols = [
        Col("pool"),
        Col("node"),
        Col("used/slots"),
        Col("state", drop=3),
        Col("jobs (slots)", drop=2, wrap=True),
        Col("accelerator", drop=4),
        Col("ray", drop=5),
    ]
    rows = []
    for p in data:
        kind = slot_kind(p["accelerator"])
        for n in p["nodes"]:
            state = "cordoned" if n["cordoned"] or p["cordoned"] else ("up" if n["alive"] else "down")
            rows.append(
                [
                    p["name"],
                    n["name"],
                    slots(f"{n['allocated_gpus']}/{n['gpus']}", kind),
                    state,
                    ", ".join(
                        [f"{j['job_id']} ({j['gpus']})" for j in n.get("jobs", [])]
                        + ([f"other teams ({n['other_gpus']})"] if n.get("other_gpus") else [])
                    )
                    or "-",
                    p["accelerator"],
                    p["ray_address"] or "-",
                ]
            )
    print_table(out, cols, rows, wide=wide, note=err)


@app.command()
def queues(
    url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False, wide: WideOpt = False
) -> None:
    """Queues with their quota and usage, in slots of their pool (GPU or CPU)."""
    with _client(url, api_key) as c:
        try:
            data = c.queues()
        except ApiError as e:
            _fail(e)
            return
        kinds = {} if as_json else _pool_kinds(c)
    if as_json:
        _print_json(data)
        return
    cols = [
        Col("queue"),
        Col("pool", drop=1),
        Col("team", drop=2),
        Col("used/nominal"),
        Col("borrowed", drop=3, right=True),
        Col("running", right=True),
        Col("queued (slots)"),
        Col("weight", drop=4, right=True),
    ]
    rows = [
        [
            q["name"],
            q["pool"],
            q["team"],
            slots(f"{q['used_gpus']}/{q['nominal_gpus']}", kinds.get(q["pool"])),
            str(q.get("borrowed_gpus", 0)),
            str(q.get("running_jobs", 0)),
            f"{q['queued_jobs']} ({q.get('queued_gpus', 0)})",
            f"{q['weight']:g}",
        ]
        for q in data
    ]
    print_table(out, cols, rows, wide=wide, note=err)


def _brief(text: str | None, most: int = 100) -> str:
    """A reason's first line, at most `most` characters (`jobs get` and --json give it whole)."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return ""
    if len(lines[0]) > most:
        return lines[0][: most - 1] + "…"
    return lines[0] + (" …" if len(lines) > 1 else "")


def _pool_kinds(c: RelaxClient) -> dict[str, str | None]:
    """Pool name -> "GPU" or "CPU" (None for a pool the key cannot see, or when pools cannot be read)."""
    try:
        return pool_kinds(c.pools())
    except ApiError:
        return {}


# jobs ---------------------------------------------------------------------------------------
@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="Comma-separated statuses.")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 20,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Newest jobs first: full ids and names always; progress in the log's numbering (steps done of all),
    slots GPU or CPU; columns that do not fit the terminal give way (--wide shows them all)."""
    with _client(url, api_key) as c:
        try:
            page = c.list_jobs(status=status, name=name, limit=limit)
        except ApiError as e:
            _fail(e)
            return
        kinds = {} if as_json or not page["data"] else _pool_kinds(c)
    if as_json:
        _print_json(page)
        return
    cols = [
        Col("id"),
        Col("name"),
        Col("status"),
        Col("step", drop=1, right=True),
        Col("slots", drop=4),
        Col("queue", drop=5),
        Col("created (UTC)", drop=3),
        Col("why waiting / reason", drop=2, wrap=True),
    ]
    rows = []
    for j in page["data"]:
        progress = f"{j['progress_step'] or 0}/{j['total_steps']}" if j["total_steps"] else "-"
        why = j["wait_reason"] if j["status"] == "QUEUED" else (j["status_reason"] or "")
        rows.append(
            [
                j["id"],
                j["name"],
                j["status"],
                progress,
                slots(j["total_gpus"], kinds.get(j["pool"])),
                j["queue"],
                full_time(j["created_at"]) if wide else short_time(j["created_at"]),
                _brief(why),
            ]
        )
    print_table(out, cols, rows, wide=wide, note=err)


@jobs_app.command("get")
def jobs_get(
    job_id: JobArg,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """A job with its spec, demand, allocation and events."""
    with _client(url, api_key) as c:
        job_id = _job_id(c, job_id)
        try:
            job = c.get_job(job_id)
            events = c.events(job_id)
        except ApiError as e:
            _fail(e)
            return
        kind = None if as_json else _pool_kinds(c).get(job["pool"])
    if as_json:
        _print_json(job | {"events": events})
        return
    out.print(
        f"[bold]{job['id']}[/bold] {job['name']}  [bold]{job['status']}[/bold]"
        + (f" ({job['failure_reason']})" if job["failure_reason"] else "")
    )
    out.print(
        f"  queue {job['queue']} · pool {job['pool']} · {slots_phrase(job['total_gpus'], kind)} · "
        f"attempt {job['attempt']}",
        highlight=False,
    )
    if job["status"] == "QUEUED" and job["wait_reason"]:
        out.print(f"  waiting: #{job['queue_position']} — {job['wait_reason']}")
    if job["total_steps"]:
        out.print(
            f"  progress: {job['progress_step'] or 0} of {job['total_steps']} steps done", highlight=False
        )
    out.print(f"  outputs: {job['output_dir']}", highlight=False, soft_wrap=True)
    rows = []
    for e in events:
        what = f"{e['from_status'] or '·'} → {e['to_status']}" if e["kind"] == "transition" else e["kind"]
        reason = event_reason(e["kind"], e["reason"], job["total_steps"])
        rows.append([full_time(e["time"]) if wide else e["time"][11:19], what, reason])
    print_table(out, [Col("time"), Col("event"), Col("reason", wrap=True)], rows, wide=wide)


@jobs_app.command("watch")
def jobs_watch(job_id: JobArg, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Follow a job to its end, as `submit --wait` does: its events and one line per step (numbered as its
    log numbers them), in the order they happened. Exit code 0 if it succeeds."""
    with _client(url, api_key) as c:
        job_id = _job_id(c, job_id)
        try:
            final = watch_job(c, job_id, out)
        except ApiError as e:
            _fail(e)
            return
    raise typer.Exit(0 if final == "SUCCEEDED" else 1)


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: JobArg,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Cancel a job; a running one stops its Ray job and frees its slots."""
    with _client(url, api_key) as c:
        job_id = _job_id(c, job_id)
        try:
            job = c.cancel_job(job_id)
        except ApiError as e:
            _fail(e)
            return
    out.print(f"{job['id']}: {job['status']}")


@jobs_app.command("logs")
def jobs_logs(
    job_id: JobArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new lines until the job ends (the job's stream)."),
    ] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """The driver's log lines (and Ray's output of a failed driver)."""

    def show(line: dict[str, Any]) -> None:
        out.print(
            f"[dim]{line['time'][11:23]} {line['source']:>6}[/dim] {escape(line['message'])}",
            highlight=False,
        )

    with _client(url, api_key) as c:
        job_id = _job_id(c, job_id)
        try:
            if follow:  # every line from the first, each once, until the job ends (a dropped link resumes)
                for kind, data in follow_stream(c, job_id, kinds=["log"]):
                    if kind == "log":
                        show(data)
                return
            for line in c.logs(job_id)["data"]:
                show(line)
        except ApiError as e:
            _fail(e)


# specs --------------------------------------------------------------------------------------
@spec_app.command("validate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def spec_validate(
    ctx: typer.Context,
    file: Annotated[
        str | None,
        typer.Argument(
            help="Job file, or a launch script (.sh) then `--` and its arguments; or `--` then Relax flags."
        ),
    ] = None,
    env: EnvOpt = None,
    inherit_env: InheritEnvOpt = False,
    script_timeout: ScriptTimeoutOpt = DEFAULT_TIMEOUT_S,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dry-run a spec on the platform: normalized values, warnings, errors, resource demand. A
    launch script is run here by bash first (nothing is started) and its training command checked."""
    file, flags = _file_and_args(ctx, file)
    args: list[str] | str | None = flags or None
    spec = None
    queue = None
    script: ResolvedScript | None = None
    if file:
        jf = _load(file, flags, env, inherit_env, script_timeout)
        spec, args, queue, script = jf.spec, jf.args, jf.queue, jf.launch_script
    elif env:
        err.print("[red]error[/red] --env is for launch scripts (.sh): give the script")
        raise typer.Exit(2)
    with _client(url, api_key) as c:
        try:
            res = c.validate_spec(
                spec=spec, args=args, queue=queue, launch_script=script.provenance() if script else None
            )
            kind = None if as_json or not res.get("pool") else _pool_kinds(c).get(res["pool"])
        except ApiError as e:
            if script is not None and not as_json:
                _print_script(script)
            _fail(e)
            return
    if as_json:
        _print_json((res | {"launch_script": script.to_dict()}) if script else res)
    else:
        if script is not None:
            _print_script(script)
        for w in res.get("warnings", []):
            out.print(f"[yellow]warning[/yellow] {w.get('field', '')}: {w.get('message', '')}")
        for e in res.get("errors", []):
            out.print(f"[red]error[/red] {e.get('field', '')}: {e.get('message', '')}")
            if e.get("hint"):
                out.print(f"  hint: {e['hint']}")
        if res["valid"]:
            d = res["demand"] or {}
            summary = str(d.get("summary") or d.get("total_gpus"))
            if kind == "CPU":  # the spec's demand is written in GPUs; this pool's slots are CPU slots
                summary = re.sub(r"\bGPU", "CPU slot", summary)
            out.print(
                f"[green]valid[/green] · would queue in {res['queue']} on pool {res['pool']} · "
                f"demand: {escape(summary)}"
            )
            if res.get("derived"):
                out.print("derived: " + ", ".join(f"{k}={v}" for k, v in res["derived"].items()))
    raise typer.Exit(0 if res["valid"] else 2)


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of the job spec (every Relax parameter)."""
    import jobspec

    out.print_json(json.dumps(jobspec.JobSpec.model_json_schema()))


# models -------------------------------------------------------------------------------------
@models_app.command("tiny")
def models_tiny(
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The folder artifacts:// names (default: your team's area, asked of the platform).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
    team: Annotated[str | None, typer.Option(help="Admins: the team whose area gets them.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Build the tiny Qwen2-style model + tokenizer (artifacts://models/tiny) and the arithmetic
    datasets (artifacts://datasets/arith/…) offline, in your team's area (the platform says where it is;
    this machine must see it, as it does the embedded platform's)."""
    from runtime.data.arith import write_datasets
    from runtime.models.tiny import build_tiny_model

    if out_dir is None:
        with _client(url, api_key) as c:
            try:
                area = c.storage(team=team)["area"]
            except ApiError as e:
                if e.code == "unreachable":
                    err.print("[dim]start the platform first (`make run`), or give --out DIR[/dim]")
                _fail(e)
                return
    root = out_dir or Path(area)
    t0 = time.time()
    model = build_tiny_model(root / "models" / "tiny", seed=seed)
    files = write_datasets(root / "datasets" / "arith")
    out.print(f"model   artifacts://models/tiny  -> {model}")
    for name, path in files.items():
        out.print(f"dataset artifacts://datasets/arith/{Path(path).name}  ({name}) -> {path}")
    out.print(f"[dim]built in {time.time() - t0:.1f}s[/dim]")


# admin --------------------------------------------------------------------------------------
teams_app = typer.Typer(help="Teams and the priority classes and queues each may use.")
admin_app.add_typer(teams_app, name="teams")


@teams_app.callback(invoke_without_command=True)
def admin_teams(
    ctx: typer.Context,
    create: Annotated[str | None, typer.Option(help="Create a team.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List teams with what each may use, or create one; `teams set TEAM …` changes its grants."""
    if ctx.invoked_subcommand is not None:
        return
    with _client(url, api_key) as c:
        if create:
            _admin(lambda: c.create_team(create))
        data = _admin(c.teams)
    if as_json:
        _print_json(data)
        return
    rows = [
        [
            team["id"],
            team["name"],
            _granted(team.get("priority_classes", []), team.get("allowed_priority_classes"), "preemptible"),
            _granted(team.get("queues", []), team.get("allowed_queues"), "own"),
        ]
        for team in data
    ]
    cols = [Col("id"), Col("team"), Col("priority classes", wrap=True), Col("queues", wrap=True)]
    print_table(out, cols, rows)


@teams_app.command("set")
def admin_teams_set(
    team: Annotated[str, typer.Argument(help="Team name or id.")],
    priority_classes: Annotated[
        str | None,
        typer.Option(
            "--priority-classes",
            help="Comma-separated classes the team may submit at (e.g. low,normal,high); "
            "`default`: every preemptible class.",
        ),
    ] = None,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues", help="Comma-separated queues of other teams it may use too; `default`: none."
        ),
    ] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Set which priority classes and (other teams') queues a team may use (admin key). A class that is
    never preempted, like `high`, is only usable when named here."""
    changes: dict[str, Any] = {}
    if priority_classes is not None:
        changes["allowed_priority_classes"] = _names(priority_classes)
    if queues is not None:
        changes["allowed_queues"] = _names(queues)
    if not changes:
        err.print("[red]error[/red] nothing to set: give --priority-classes and/or --queues")
        raise typer.Exit(2)
    with _client(url, api_key) as c:
        t = _admin(lambda: c.update_team(team, **changes))
    out.print(
        f"team {t['name']}: priority classes {', '.join(t['priority_classes']) or 'none'}; "
        f"queues {', '.join(t['queues']) or 'none'}"
    )


def _names(text: str) -> list[str] | None:
    """`a,b` -> [a, b]; `default` -> None (the default grant)."""
    if text.strip() == "default":
        return None
    return [n.strip() for n in text.split(",") if n.strip()]


def _granted(effective: list[str], grant: list[str] | None, default: str) -> str:
    return ", ".join(effective) + ("" if grant is not None else f"  (default: {default})")


def _duration(text: str) -> timedelta:
    """`30d`, `12h`, `2w`, `45m` (a bare number is days)."""
    units = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    value, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "d")
    try:
        amount = float(value)
    except ValueError:
        err.print(f"[red]error[/red] {escape(text)!r}: expected a duration such as 30d, 12h or 2w")
        raise typer.Exit(2) from None
    return timedelta(seconds=amount * units[unit])


def _since(text: str) -> str:
    """An ISO time, or a duration back from now (`1h`, `7d`)."""
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        return (datetime.now(UTC) - _duration(text)).isoformat()


@admin_app.command("create-key")
def admin_create_key(
    name: str,
    team: Annotated[str | None, typer.Option(help="Team name or id (a team admin's key: its own).")] = None,
    role: Annotated[str, typer.Option(help="admin, team_admin, member or viewer.")] = "member",
    expires_in: Annotated[
        str | None, typer.Option("--expires-in", help="Lifetime, e.g. 30d, 12h, 2w (default: until revoked).")
    ] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create an API key (the secret is printed once)."""
    expires_at = (datetime.now(UTC) + _duration(expires_in)).isoformat() if expires_in else None
    with _client(url, api_key) as c:
        k = _admin(lambda: c.create_api_key(name, role=role, team=team, expires_at=expires_at))
    out.print(k["key"], highlight=False)
    if k.get("expires_at"):
        err.print(
            f"[dim]{k['id']} ({k['role']}) expires at {k['expires_at'][:19].replace('T', ' ')} UTC[/dim]"
        )


@admin_app.command("keys")
def admin_keys(
    team: Annotated[str | None, typer.Option(help="Only this team's keys.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """API keys without their secrets (an admin: all; a team admin: the team's; others: their own)."""
    with _client(url, api_key) as c:
        data = _admin(lambda: c.api_keys(team=team))
    if as_json:
        _print_json(data)
        return
    cols = [
        Col("id"),
        Col("name"),
        Col("role"),
        Col("team", drop=3),
        Col("prefix", drop=4),
        Col("created (UTC)", drop=5),
        Col("expires", drop=2),
        Col("revoked", drop=1),
    ]
    rows = [
        [
            k["id"],
            k["name"],
            k["role"],
            k["team_id"] or "-",
            k["prefix"] + "…",
            full_time(k["created_at"]) if wide else short_time(k["created_at"]),
            (full_time if wide else short_time)(k.get("expires_at")),
            (full_time if wide else short_time)(k["revoked_at"]),
        ]
        for k in data
    ]
    print_table(out, cols, rows, wide=wide, note=err)


@admin_app.command("revoke-key")
def admin_revoke_key(key_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Revoke an API key at once (an admin: any; a team admin: the team's; anyone: their own)."""
    with _client(url, api_key) as c:
        k = _admin(lambda: c.revoke_api_key(key_id))
    out.print(f"{k['id']} ({k['name']}): revoked")


@admin_app.command("audit")
def admin_audit(
    since: Annotated[str | None, typer.Option(help="From this time (ISO) or this long ago (1h, 7d).")] = None,
    key: Annotated[str | None, typer.Option(help="Calls made with this key id.")] = None,
    team: Annotated[str | None, typer.Option(help="Calls made by keys of this team.")] = None,
    path: Annotated[
        str | None, typer.Option(help="Route template or its start, e.g. /v1/jobs or /v1/api-keys.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows to show (newest first).")] = 50,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """The audit log (admin key): every mutating call, refused ones too — who, what, on what, status."""
    with _client(url, api_key) as c:
        page = _admin(
            lambda: c.audit(
                since=_since(since) if since else None, key=key, team=team, path=path, limit=limit
            )
        )
    if as_json:
        _print_json(page)
        return
    cols = [
        Col("time (UTC)"),
        Col("key", drop=3),
        Col("role", drop=5),
        Col("call"),
        Col("target", drop=2),
        Col("status", right=True),
        Col("details", drop=4, wrap=True),
    ]
    rows = [
        [
            full_time(e["time"]),
            e["key_id"] or "-",
            e["role"] or "-",
            f"{e['method']} {e['path']}",
            e["target"] or "-",
            str(e["status_code"]),
            ", ".join(f"{k}={v}" for k, v in e["details"].items()),
        ]
        for e in page["data"]
    ]
    print_table(out, cols, rows, wide=wide, note=err)


def _file_and_args(ctx: typer.Context, file: str | None) -> tuple[str | None, list[str]]:
    """(file, words after it). `cmd -- --flag v`: click hands the first flag over as FILE. After a
    launch script the words are its arguments; after a job file there must be none."""
    args = list(ctx.args)
    if file and file.startswith("--"):
        return None, [file, *args]
    if file and args and not is_launch_script(Path(file)):
        err.print(
            "[red]error[/red] give a job file or Relax flags after `--`, not both "
            "(arguments after FILE are only for launch scripts, .sh)"
        )
        raise typer.Exit(2)
    return file, args


def _load(
    file: str, script_args: list[str], env: list[str] | None, inherit_env: bool, script_timeout: float
) -> JobFile:
    path = Path(file)
    if env and not is_launch_script(path):
        err.print(f"[red]error[/red] --env is for launch scripts (.sh); {escape(file)} is a job file")
        raise typer.Exit(2)
    try:
        return load_job_file(
            path,
            script_env=_env_pairs(env),
            script_args=script_args,
            inherit_env=inherit_env,
            script_timeout=script_timeout,
        )
    except LaunchScriptError as e:
        err.print(f"[red]error[/red] {escape(str(e))}", highlight=False)
        if e.code in ("no_training_command", "exited", "timeout"):
            err.print(
                "[dim]nothing was submitted; relaxctl runs the script with bash, see `relaxctl submit --help`[/dim]"
            )
        raise typer.Exit(2) from None
    except JobFileError as e:
        err.print(f"[red]error[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"[red]error[/red] --env {escape(item)!r}: expected NAME=VALUE")
            raise typer.Exit(2)
        pairs[key] = value
    return pairs


def _print_script(s: ResolvedScript) -> None:
    """Which line of the script is the training command, and what was not run."""
    base = os.path.dirname(s.path)

    def where(file: str, line: int) -> str:
        if file == s.path:
            return f"line {line}"
        return f"{os.path.relpath(file, base)}:{line}"

    via = f"{s.launcher} → " if s.launcher != "python" else ""
    out.print(
        f"launch script [bold]{escape(_rel(s.path))}[/bold]: training command at "
        f"[bold]{escape(where(s.file, s.line))}[/bold] ({escape(via + s.entrypoint)}, {len(s.argv)} words)",
        highlight=False,
    )
    for n, c in enumerate(s.skipped[:10]):
        label = "  not run: " if n == 0 else "           "
        out.print(f"{label}{escape(c.what)} ({escape(where(c.file, c.line))})", highlight=False)
    if len(s.skipped) > 10:
        out.print(f"           … and {len(s.skipped) - 10} more (--json lists them)")
    if s.neutralised:
        counts: dict[str, int] = {}
        for c in s.neutralised:
            counts[c.argv[0]] = counts.get(c.argv[0], 0) + 1
        summary = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in counts.items())
        out.print(f"  [dim]did nothing: {escape(summary)}[/dim]", highlight=False)
    for note in s.notes:
        out.print(f"  [yellow]note[/yellow] {escape(note)}", highlight=False)


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _labels(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            err.print(f"[red]error[/red] label {item!r}: expected key=value")
            raise typer.Exit(2)
        out[key] = value
    return out


def _admin(call: Any) -> Any:
    try:
        return call()
    except ApiError as e:
        _fail(e)


@admin_app.command("create-pool")
def admin_create_pool(
    name: str,
    accelerator: Annotated[str, typer.Option(help="e.g. h200, a100, cpu")],
    ray_address: Annotated[
        str | None, typer.Option(help="Ray Jobs API address of the pool's cluster.")
    ] = None,
    python: Annotated[str | None, typer.Option(help="Interpreter of the drivers on the cluster.")] = None,
    node: Annotated[list[str] | None, typer.Option(help="NAME:GPUS, repeatable.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create a pool of nodes (each NAME:GPUS)."""
    nodes = []
    for item in node or []:
        n, _, g = item.partition(":")
        if not g.isdigit():
            err.print(f"[red]error[/red] --node {item!r}: expected NAME:GPUS")
            raise typer.Exit(2)
        nodes.append({"name": n, "gpus": int(g)})
    with _client(url, api_key) as c:
        p = _admin(
            lambda: c.create_pool(name, accelerator, ray_address=ray_address, python=python, nodes=nodes)
        )
    out.print(
        f"pool {p['name']}: {slots_phrase(p['total_gpus'], slot_kind(p['accelerator']))} "
        f"on {len(p['nodes'])} node(s)"
    )


@admin_app.command("set-node")
def admin_set_node(
    pool: str,
    node: str,
    gpus: Annotated[
        int, typer.Option("--gpus", "--slots", help="Slots of the node: its GPUs (CPU slots in a cpu pool).")
    ],
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Add a node to a pool, or change its slots (GPUs, or CPU slots in a cpu pool) and labels."""
    with _client(url, api_key) as c:
        p = _admin(lambda: c.put_node(pool, node, gpus, _labels(label)))
    kind = slot_kind(p.get("accelerator")) if isinstance(p, dict) else None
    out.print(f"node {node} of pool {pool}: {slots_phrase(gpus, kind)}")


@admin_app.command("cordon")
def admin_cordon(
    pool: str,
    node: str,
    undo: Annotated[bool, typer.Option("--undo", help="Uncordon.")] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Keep new jobs off a node (running jobs stay); --undo lets them on again."""
    with _client(url, api_key) as c:
        _admin(lambda: c.update_node(pool, node, cordoned=not undo))
    out.print(f"node {node} of pool {pool}: {'uncordoned' if undo else 'cordoned'}")


@admin_app.command("drain")
def admin_drain(pool: str, node: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Cordon a node and requeue its jobs (each checkpoints, then resumes elsewhere)."""
    with _client(url, api_key) as c:
        r = _admin(lambda: c.drain_node(pool, node))
    out.print(f"node {node} of pool {pool} drained; requeued: {', '.join(r['requeued']) or 'none'}")


@admin_app.command("node-down")
def admin_node_down(
    pool: str,
    node: str,
    up: Annotated[bool, typer.Option("--up", help="Mark it up again.")] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Mark a node lost (its jobs are requeued at once), or --up again."""
    with _client(url, api_key) as c:
        r = _admin(lambda: c.update_node(pool, node, alive=up))
    out.print(
        f"node {node} of pool {pool}: {'up' if up else 'down'}; requeued: {', '.join(r['requeued']) or 'none'}"
    )


@admin_app.command("create-queue")
def admin_create_queue(
    name: str,
    pool: Annotated[str, typer.Option()],
    team: Annotated[str, typer.Option()],
    nominal_gpus: Annotated[int, typer.Option(help="Guaranteed slots: GPUs (CPU slots in a cpu pool).")],
    borrowing_limit: Annotated[
        int | None, typer.Option(help="Most slots above nominal it may borrow.")
    ] = None,
    lending_limit: Annotated[
        int | None, typer.Option(help="Most idle nominal slots others may borrow.")
    ] = None,
    weight: Annotated[float, typer.Option(help="Fair-share weight.")] = 1.0,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create a team's queue in a pool with its quota."""
    with _client(url, api_key) as c:
        kinds = _pool_kinds(c)
        q = _admin(
            lambda: c.create_queue(
                name,
                pool,
                team,
                nominal_gpus,
                borrowing_limit=borrowing_limit,
                lending_limit=lending_limit,
                weight=weight,
            )
        )
    out.print(
        f"queue {q['name']} of team {q['team']} in pool {q['pool']}: "
        f"nominal {slots_phrase(q['nominal_gpus'], kinds.get(q['pool']))}"
    )


@admin_app.command("priority-classes")
def admin_priority_classes(
    create: Annotated[str | None, typer.Option(help="Create a class with this name.")] = None,
    value: Annotated[int, typer.Option(help="Its value (higher runs first).")] = 0,
    preemptible: Annotated[bool, typer.Option(help="Whether its jobs may be preempted.")] = True,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List priority classes, or create one."""
    with _client(url, api_key) as c:
        if create:
            _admin(lambda: c.create_priority_class(create, value, preemptible=preemptible))
        data = _admin(c.priority_classes)
    rows = [
        [p["name"], str(p["value"]), "yes" if p["preemptible"] else "no", p["description"] or ""]
        for p in data
    ]
    cols = [Col("class"), Col("value", right=True), Col("preemptible"), Col("description", wrap=True)]
    print_table(out, cols, rows)


# admin grants -------------------------------------------------------------------------------
grants_app = typer.Typer(
    help="Paths outside a team's area that its jobs may read (ro) or read and write (rw).",
    no_args_is_help=True,
)
admin_app.add_typer(grants_app, name="grants")


@grants_app.command("list")
def admin_grants_list(
    team: Annotated[str | None, typer.Option(help="Only this team's grants.")] = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List path grants."""
    with _client(url, api_key) as c:
        data = _admin(lambda: c.path_grants(team))
    if json_out:
        _print_json(data)
        return
    rows = [[g["id"], g["team_id"], g["pool"] or "(every pool)", g["mode"], g["path"]] for g in data]
    print_table(out, [Col("id"), Col("team"), Col("pool"), Col("mode"), Col("path")], rows)


@grants_app.command("add")
def admin_grants_add(
    team: Annotated[str, typer.Argument(help="The team (name or id).")],
    path: Annotated[
        str, typer.Argument(help="An absolute path outside the platform's home and artifact store.")
    ],
    mode: Annotated[str, typer.Option(help="ro (read) or rw (read and write).")] = "ro",
    pool: Annotated[str | None, typer.Option(help="Only jobs in this pool (default: every pool).")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Let a team's jobs read (ro) or read and write (rw) PATH."""
    with _client(url, api_key) as c:
        g = _admin(lambda: c.add_path_grant(team, path, mode=mode, pool=pool))
    where = f"pool {g['pool']}" if g["pool"] else "every pool"
    verb = "read and write" if g["mode"] == "rw" else "read"
    out.print(f"{g['id']}  team {g['team_id']} may {verb} {g['path']} in {where}")


@grants_app.command("remove")
def admin_grants_remove(grant_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Remove a path grant (jobs already queued lose it when they next start)."""
    with _client(url, api_key) as c:
        g = _admin(lambda: c.remove_path_grant(grant_id))
    out.print(f"removed {g['id']} ({g['mode']} {g['path']})")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
