"""`relaxctl`: the command line of Relax Platform (reads RELAX_URL and RELAX_API_KEY).

What the commands share (the consoles, --url/--api-key/--json/--wide, API errors, tables) is in
client/commands.py: a command that calls the API is `@api_call(...)` and states only what it asks and prints."""

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
from rich.markup import escape

from client import commands as cmd
from client.commands import (
    EnvOpt,
    InheritEnvOpt,
    JobArg,
    JsonOpt,
    ScriptTimeoutOpt,
    Table,
    api_call,
)
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
from client.evals import evals_app, run_eval
from client.files import files_app
from client.jobfile import JobFile, JobFileError, is_launch_script, load_job_file
from client.launch_script import DEFAULT_TIMEOUT_S, LaunchScriptError, ResolvedScript, display_path
from client.sdk import ApiError, RelaxClient
from client.watch import follow as follow_stream
from client.watch import watch_job
from client.webhooks import webhooks_app
from wire.jobs import JobStatus

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
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(files_app, name="files")
# CI evals (issue 15 item 2; client/evals.py): `relaxctl eval ... --wait --junit out.xml`, `relaxctl evals list|get`
app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_eval)
app.add_typer(evals_app, name="evals")


# ---------------------------------------------------------------------------------------------
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@api_call("json")
def submit(
    c: RelaxClient,
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
    *,
    as_json: bool,
) -> None:
    """Submit a job from a file, from a launch script (run here by bash to find its training
    command), or from Relax flags after `--`; with --wait, follow it to the end."""
    file, args = _file_and_args(ctx, file)
    if not file and not args:
        cmd.error(
            "nothing to submit: `relaxctl submit FILE`, `relaxctl submit SCRIPT.sh [-- script args]` "
            "or `relaxctl submit -- --flag value ...`"
        )
    jf = _load(file, args, env, inherit_env, script_timeout)
    script = jf.launch_script
    if script is not None and not as_json:
        _print_script(script)
    job = c.submit_job(
        spec=jf.spec,
        args=jf.args,
        name=name or jf.name,
        queue=queue or jf.queue,
        priority_class=priority_class or jf.priority_class,
        labels=jf.labels,
        idempotency_key=idempotency_key,
        launch_script=script.provenance() if script else None,
    )
    if as_json and not wait:
        cmd.print_json(job)
        return
    cmd.out.print(
        f"submitted [bold]{job['id']}[/bold] ({job['name']}) to queue {job['queue']} on pool {job['pool']}"
    )
    for w in job["submitted"].get("warnings") or []:
        cmd.out.print(f"  [yellow]warning[/yellow] {w.get('field', '')}: {w.get('message', '')}")
    if wait:
        final = watch_job(c, job["id"], cmd.out)
        raise typer.Exit(0 if final == JobStatus.SUCCEEDED else 1)


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
        cmd.error(
            f"a platform already runs on {where} (pid {state.pid}, {state.url or 'starting'}): "
            f"`relaxctl down --home {where}` stops it",
            1,
        )
    if port is not None and not 1 <= port <= 65535:
        cmd.error(f"--port {port}: a TCP port is 1-65535")
    if not detach:
        env = os.environ.copy() | {"RELAX_HOME": str(where)}
        if port is not None:
            env["RELAX_PORT"] = str(port)
        os.execve(sys.executable, [sys.executable, "-m", "api.embedded"], env)
    cmd.out.print(f"starting the platform on {where} (output: {where / 'logs' / 'platform.log'}) ...")
    code, state = platform.start_detached(where, port)
    if code == 0 and state.running:
        cmd.out.print(
            f"Relax Platform is up on {state.url} (pid {state.pid}, home {where})\n"
            f"  stop: relaxctl down --home {where}    status: relaxctl status --home {where}"
        )
        return
    why = (state.state or {}).get("reason") if state.state else None
    cmd.error(
        "the platform did not come up"
        + (f" (exit code {code})" if code > 0 else " in time" if code < 0 else "")
        + (f": {escape(str(why))}" if why else "")
        + f"; see {where / 'logs' / 'platform.log'}",
        1,
    )


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
        cmd.out.print(f"no platform runs on {where}")
        return
    if outcome == "timeout":
        cmd.error(f"the platform (pid {state.pid}) is still stopping after {timeout:.0f} s", 1)
    cmd.out.print(f"Relax Platform on {where} stopped")


@app.command()
def status(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Is the embedded platform of this home running, is it ready, and how is each of its parts.
    Exit code 0: running and ready; 1: not running; 3: running but not ready."""
    from client import platform

    where = platform.home_dir(home)
    state = platform.read_state(where)
    ready, body = platform.readiness(state.url) if state.running and state.url else (False, "not running")
    if as_json:
        cmd.print_json(
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
        cmd.out.print(
            f"no platform runs on {where}"
            + (f" (last: {last}{', ' + escape(str(reason)) if reason else ''})" if last else "")
        )
    else:
        cmd.out.print(
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
        print_table(cmd.out, [*cols, Col("detail", wrap=True)], rows)
        if not ready:
            why = body.get("down") if isinstance(body, dict) else body
            cmd.out.print(f"  /readyz: [red]not ready[/red] ({escape(str(why))})")
    raise typer.Exit(0 if state.running and ready else 1 if not state.running else 3)


@app.command()
@api_call()
def dashboard(
    c: RelaxClient,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Only print the link.")] = False,
) -> None:
    """Open the web dashboard, signed in as your API key. The key itself never leaves this process: the
    link carries a one-time login code (good for one sign-in within two minutes), in the URL fragment,
    which browsers never send to a server; the dashboard exchanges it and removes it from the address."""
    import webbrowser

    link = f"{c.url}/#code={c.login_code()['code']}" if c.api_key else f"{c.url}/"
    cmd.out.print(link, highlight=False)
    if not no_browser:
        webbrowser.open(link)


@app.command()
@api_call("json", "wide")
def metrics(
    c: RelaxClient,
    job_id: JobArg,
    names: Annotated[list[str] | None, typer.Option("--name", "-n", help="Only these metrics.")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print every point as it comes (from the first) until the job ends: time, step, metric, "
            "value; with --json one JSON object a line.",
        ),
    ] = False,
    *,
    as_json: bool,
) -> Table | None:
    """Every metric of a job: last, first, min and max value, the step of its last point (numbered as the
    job's log numbers steps, 1 to the last; an evaluation's step is the number of steps done before it, 0
    before the first) and the number of points. --json gives the API's series unchanged, where a step's own
    metrics count steps from 0."""
    job_id = cmd.job_id(c, job_id)
    if follow:
        _follow_metrics(c, job_id, names, as_json=as_json)
        return None
    series = c.metrics(job_id, names=names)
    cols = [
        Col("metric"),
        Col("last", right=True),
        Col("step", right=True),
        Col("first", drop=3, right=True),
        Col("min", drop=2, right=True),
        Col("max", drop=2, right=True),
        Col("points", drop=4, right=True),
    ]
    return Table(series, cols, lambda: [_metric_row(n, pts) for n, pts in sorted(series.items()) if pts])


def _metric_row(name: str, pts: list[dict[str, Any]]) -> list[str]:
    vals = [p["value"] for p in pts]
    last, step = f"{vals[-1]:.4g}", str(log_step(name, pts[-1]["step"]))
    return [name, last, step, f"{vals[0]:.4g}", f"{min(vals):.4g}", f"{max(vals):.4g}", str(len(pts))]


def _follow_metrics(c: RelaxClient, job_id: str, names: list[str] | None, *, as_json: bool) -> None:
    """`metrics -f`: the job's stream of metric points, each once, until the job ends."""
    wanted = {n for item in names or [] for n in item.split(",") if n}
    for kind, point in follow_stream(c, job_id, kinds=["metric"]):
        if kind != "metric" or (wanted and point["name"] not in wanted):
            continue
        if as_json:
            print(json.dumps(point), flush=True)
            continue
        cmd.out.print(
            f"[dim]{point['time'][11:19]}[/dim] step {log_step(point['name'], point['step']):>6}  "
            f"{escape(point['name'])} {point['value']:.6g}",
            highlight=False,
        )


@app.command()
@api_call("json", "wide")
def pools(c: RelaxClient) -> Table:
    """Pools, their nodes and what is allocated on each: slots in use of the node's, GPUs or CPU slots (the
    embedded platform on a machine without GPUs schedules CPU slots)."""
    data = c.pools()
    cols = [
        Col("pool"),
        Col("node"),
        Col("used/slots"),
        Col("state", drop=3),
        Col("jobs (slots)", drop=2, wrap=True),
        Col("accelerator", drop=4),
        Col("ray", drop=5),
    ]
    return Table(data, cols, lambda: [_node_row(p, n) for p in data for n in p["nodes"]])


def _node_row(p: dict[str, Any], n: dict[str, Any]) -> list[str]:
    state = "cordoned" if n["cordoned"] or p["cordoned"] else ("up" if n["alive"] else "down")
    jobs = [f"{j['job_id']} ({j['gpus']})" for j in n.get("jobs", [])]
    others = [f"other teams ({n['other_gpus']})"] if n.get("other_gpus") else []
    used = slots(f"{n['allocated_gpus']}/{n['gpus']}", slot_kind(p["accelerator"]))
    return [
        p["name"],
        n["name"],
        used,
        state,
        ", ".join(jobs + others) or "-",
        p["accelerator"],
        p["ray_address"] or "-",
    ]


@app.command()
@api_call("json", "wide")
def queues(c: RelaxClient) -> Table:
    """Queues with their quota and usage, in slots of their pool (GPU or CPU)."""
    data = c.queues()

    def rows() -> list[list[str]]:
        kinds = _pool_kinds(c)
        return [
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
    return Table(data, cols, rows)


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
@api_call("json", "wide")
def jobs_list(
    c: RelaxClient,
    status: Annotated[str | None, typer.Option(help="Comma-separated statuses.")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 20,
    *,
    wide: bool,
) -> Table:
    """Newest jobs first: full ids and names always; progress in the log's numbering (steps done of all),
    slots GPU or CPU; columns that do not fit the terminal give way (--wide shows them all)."""
    page = c.list_jobs(status=status, name=name, limit=limit)

    def rows() -> list[list[str]]:
        kinds = _pool_kinds(c) if page["data"] else {}
        return [
            [
                j["id"],
                j["name"],
                j["status"],
                f"{j['progress_step'] or 0}/{j['total_steps']}" if j["total_steps"] else "-",
                slots(j["total_gpus"], kinds.get(j["pool"])),
                j["queue"],
                full_time(j["created_at"]) if wide else short_time(j["created_at"]),
                _brief(j["wait_reason"] if j["status"] == JobStatus.QUEUED else (j["status_reason"] or "")),
            ]
            for j in page["data"]
        ]

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
    return Table(page, cols, rows)


@jobs_app.command("get")
@api_call("json", "wide")
def jobs_get(c: RelaxClient, job_id: JobArg, *, as_json: bool, wide: bool) -> None:
    """A job with its spec, demand, allocation and events."""
    job_id = cmd.job_id(c, job_id)
    job = c.get_job(job_id)
    events = c.events(job_id)
    if as_json:
        cmd.print_json(job | {"events": events})
        return
    kind = _pool_kinds(c).get(job["pool"])
    cmd.out.print(
        f"[bold]{job['id']}[/bold] {job['name']}  [bold]{job['status']}[/bold]"
        + (f" ({job['failure_reason']})" if job["failure_reason"] else "")
    )
    cmd.out.print(
        f"  queue {job['queue']} · pool {job['pool']} · {slots_phrase(job['total_gpus'], kind)} · "
        f"attempt {job['attempt']}",
        highlight=False,
    )
    if job["status"] == JobStatus.QUEUED and job["wait_reason"]:
        cmd.out.print(f"  waiting: #{job['queue_position']} — {job['wait_reason']}")
    if job["total_steps"]:
        cmd.out.print(
            f"  progress: {job['progress_step'] or 0} of {job['total_steps']} steps done", highlight=False
        )
    cmd.out.print(f"  outputs: {job['output_dir']}", highlight=False, soft_wrap=True)
    rows = []
    for e in events:
        what = f"{e['from_status'] or '·'} → {e['to_status']}" if e["kind"] == "transition" else e["kind"]
        reason = event_reason(e["kind"], e["reason"], job["total_steps"])
        rows.append([full_time(e["time"]) if wide else e["time"][11:19], what, reason])
    print_table(cmd.out, [Col("time"), Col("event"), Col("reason", wrap=True)], rows, wide=wide)


@jobs_app.command("watch")
@api_call()
def jobs_watch(c: RelaxClient, job_id: JobArg) -> None:
    """Follow a job to its end, as `submit --wait` does: its events and one line per step (numbered as its
    log numbers them), in the order they happened. Exit code 0 if it succeeds."""
    final = watch_job(c, cmd.job_id(c, job_id), cmd.out)
    raise typer.Exit(0 if final == JobStatus.SUCCEEDED else 1)


@jobs_app.command("cancel")
@api_call()
def jobs_cancel(c: RelaxClient, job_id: JobArg) -> None:
    """Cancel a job; a running one stops its Ray job and frees its slots."""
    job = c.cancel_job(cmd.job_id(c, job_id))
    cmd.out.print(f"{job['id']}: {job['status']}")


@jobs_app.command("logs")
@api_call()
def jobs_logs(
    c: RelaxClient,
    job_id: JobArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new lines until the job ends (the job's stream)."),
    ] = False,
) -> None:
    """The driver's log lines (and Ray's output of a failed driver)."""

    def show(line: dict[str, Any]) -> None:
        cmd.out.print(
            f"[dim]{line['time'][11:23]} {line['source']:>6}[/dim] {escape(line['message'])}",
            highlight=False,
        )

    job_id = cmd.job_id(c, job_id)
    if follow:  # every line from the first, each once, until the job ends (a dropped link resumes)
        for kind, data in follow_stream(c, job_id, kinds=["log"]):
            if kind == "log":
                show(data)
        return
    for line in c.logs(job_id)["data"]:
        show(line)


# specs --------------------------------------------------------------------------------------
@spec_app.command("validate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@api_call("json")
def spec_validate(
    c: RelaxClient,
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
    *,
    as_json: bool,
) -> None:
    """Dry-run a spec on the platform: normalized values, warnings, errors, resource demand. A
    launch script is run here by bash first (nothing is started) and its training command checked."""
    file, flags = _file_and_args(ctx, file)
    jf = _load(file, flags, env, inherit_env, script_timeout)
    script = jf.launch_script
    try:
        res = c.validate_spec(
            spec=jf.spec, args=jf.args, queue=jf.queue, launch_script=script.provenance() if script else None
        )
        kind = None if as_json or not res.get("pool") else _pool_kinds(c).get(res["pool"])
    except ApiError:
        if script is not None and not as_json:
            _print_script(script)
        raise
    if as_json:
        cmd.print_json((res | {"launch_script": script.to_dict()}) if script else res)
    else:
        if script is not None:
            _print_script(script)
        for w in res.get("warnings", []):
            cmd.out.print(f"[yellow]warning[/yellow] {w.get('field', '')}: {w.get('message', '')}")
        for e in res.get("errors", []):
            cmd.out.print(f"[red]error[/red] {e.get('field', '')}: {e.get('message', '')}")
            if e.get("hint"):
                cmd.out.print(f"  hint: {e['hint']}")
        if res["valid"]:
            d = res["demand"] or {}
            summary = str(d.get("summary") or d.get("total_gpus"))
            if kind == "CPU":  # the spec's demand is written in GPUs; this pool's slots are CPU slots
                summary = re.sub(r"\bGPU", "CPU slot", summary)
            cmd.out.print(
                f"[green]valid[/green] · would queue in {res['queue']} on pool {res['pool']} · "
                f"demand: {escape(summary)}"
            )
            if res.get("derived"):
                cmd.out.print("derived: " + ", ".join(f"{k}={v}" for k, v in res["derived"].items()))
    raise typer.Exit(0 if res["valid"] else 2)


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of the job spec (every Relax parameter)."""
    import jobspec

    cmd.out.print_json(json.dumps(jobspec.JobSpec.model_json_schema()))


# models -------------------------------------------------------------------------------------
@models_app.command("tiny")
@api_call()
def models_tiny(
    c: RelaxClient,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The folder artifacts:// names (default: your team's area, asked of the platform).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
    team: Annotated[str | None, typer.Option(help="Admins: the team whose area gets them.")] = None,
) -> None:
    """Build the tiny Qwen2-style model + tokenizer (artifacts://models/tiny) and the arithmetic
    datasets (artifacts://datasets/arith/…) offline, in your team's area (the platform says where it is;
    this machine must see it, as it does the embedded platform's)."""
    from runtime.data.arith import write_datasets
    from runtime.models.tiny import build_tiny_model

    if out_dir is None:
        try:
            out_dir = Path(c.storage(team=team)["area"])
        except ApiError as e:
            if e.code == "unreachable":
                cmd.err.print("[dim]start the platform first (`make run`), or give --out DIR[/dim]")
            raise
    t0 = time.time()
    model = build_tiny_model(out_dir / "models" / "tiny", seed=seed)
    files = write_datasets(out_dir / "datasets" / "arith")
    cmd.out.print(f"model   artifacts://models/tiny  -> {model}")
    for name, path in files.items():
        cmd.out.print(f"dataset artifacts://datasets/arith/{Path(path).name}  ({name}) -> {path}")
    cmd.out.print(f"[dim]built in {time.time() - t0:.1f}s[/dim]")


# admin --------------------------------------------------------------------------------------
teams_app = typer.Typer(help="Teams and the priority classes and queues each may use.")
admin_app.add_typer(teams_app, name="teams")


@teams_app.callback(invoke_without_command=True)
@api_call("json")
def admin_teams(
    c: RelaxClient,
    ctx: typer.Context,
    create: Annotated[str | None, typer.Option(help="Create a team.")] = None,
) -> Table | None:
    """List teams with what each may use, or create one; `teams set TEAM …` changes its grants."""
    if ctx.invoked_subcommand is not None:
        return None
    if create:
        c.create_team(create)
    data = c.teams()
    cols = [Col("id"), Col("team"), Col("priority classes", wrap=True), Col("queues", wrap=True)]
    return Table(
        data,
        cols,
        lambda: [
            [
                t["id"],
                t["name"],
                _granted(t.get("priority_classes", []), t.get("allowed_priority_classes"), "preemptible"),
                _granted(t.get("queues", []), t.get("allowed_queues"), "own"),
            ]
            for t in data
        ],
    )


@teams_app.command("set")
@api_call()
def admin_teams_set(
    c: RelaxClient,
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
) -> None:
    """Set which priority classes and (other teams') queues a team may use (admin key). A class that is
    never preempted, like `high`, is only usable when named here."""
    changes: dict[str, Any] = {}
    if priority_classes is not None:
        changes["allowed_priority_classes"] = _names(priority_classes)
    if queues is not None:
        changes["allowed_queues"] = _names(queues)
    if not changes:
        cmd.error("nothing to set: give --priority-classes and/or --queues")
    t = c.update_team(team, **changes)
    cmd.out.print(
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
        cmd.error(f"{escape(text)!r}: expected a duration such as 30d, 12h or 2w")
    return timedelta(seconds=amount * units[unit])


def _since(text: str) -> str:
    """An ISO time, or a duration back from now (`1h`, `7d`)."""
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        return (datetime.now(UTC) - _duration(text)).isoformat()


@admin_app.command("create-key")
@api_call()
def admin_create_key(
    c: RelaxClient,
    name: str,
    team: Annotated[str | None, typer.Option(help="Team name or id (a team admin's key: its own).")] = None,
    role: Annotated[str, typer.Option(help="admin, team_admin, member or viewer.")] = "member",
    expires_in: Annotated[
        str | None, typer.Option("--expires-in", help="Lifetime, e.g. 30d, 12h, 2w (default: until revoked).")
    ] = None,
) -> None:
    """Create an API key (the secret is printed once)."""
    expires_at = (datetime.now(UTC) + _duration(expires_in)).isoformat() if expires_in else None
    k = c.create_api_key(name, role=role, team=team, expires_at=expires_at)
    cmd.out.print(k["key"], highlight=False)
    if k.get("expires_at"):
        cmd.err.print(
            f"[dim]{k['id']} ({k['role']}) expires at {k['expires_at'][:19].replace('T', ' ')} UTC[/dim]"
        )


@admin_app.command("keys")
@api_call("json", "wide")
def admin_keys(
    c: RelaxClient,
    team: Annotated[str | None, typer.Option(help="Only this team's keys.")] = None,
    *,
    wide: bool,
) -> Table:
    """API keys without their secrets (an admin: all; a team admin: the team's; others: their own)."""
    data = c.api_keys(team=team)
    at = full_time if wide else short_time
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
    return Table(
        data,
        cols,
        lambda: [
            [
                k["id"],
                k["name"],
                k["role"],
                k["team_id"] or "-",
                k["prefix"] + "…",
                at(k["created_at"]),
                at(k.get("expires_at")),
                at(k["revoked_at"]),
            ]
            for k in data
        ],
    )


@admin_app.command("revoke-key")
@api_call()
def admin_revoke_key(c: RelaxClient, key_id: str) -> None:
    """Revoke an API key at once (an admin: any; a team admin: the team's; anyone: their own)."""
    k = c.revoke_api_key(key_id)
    cmd.out.print(f"{k['id']} ({k['name']}): revoked")


@admin_app.command("audit")
@api_call("json", "wide")
def admin_audit(
    c: RelaxClient,
    since: Annotated[str | None, typer.Option(help="From this time (ISO) or this long ago (1h, 7d).")] = None,
    key: Annotated[str | None, typer.Option(help="Calls made with this key id.")] = None,
    team: Annotated[str | None, typer.Option(help="Calls made by keys of this team.")] = None,
    path: Annotated[
        str | None, typer.Option(help="Route template or its start, e.g. /v1/jobs or /v1/api-keys.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows to show (newest first).")] = 50,
) -> Table:
    """The audit log (admin key): every mutating call, refused ones too — who, what, on what, status."""
    page = c.audit(since=_since(since) if since else None, key=key, team=team, path=path, limit=limit)
    cols = [
        Col("time (UTC)"),
        Col("key", drop=3),
        Col("role", drop=5),
        Col("call"),
        Col("target", drop=2),
        Col("status", right=True),
        Col("details", drop=4, wrap=True),
    ]
    return Table(
        page,
        cols,
        lambda: [
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
        ],
    )


def _file_and_args(ctx: typer.Context, file: str | None) -> tuple[str | None, list[str]]:
    """(file, words after it). `cmd -- --flag v`: click hands the first flag over as FILE. After a
    launch script the words are its arguments; after a job file there must be none."""
    args = list(ctx.args)
    if file and file.startswith("--"):
        return None, [file, *args]
    if file and args and not is_launch_script(Path(file)):
        cmd.error(
            "give a job file or Relax flags after `--`, not both "
            "(arguments after FILE are only for launch scripts, .sh)"
        )
    return file, args


def _load(
    file: str | None, args: list[str], env: list[str] | None, inherit_env: bool, script_timeout: float
) -> JobFile:
    """FILE read (a launch script run here by bash, with `args` its arguments); without a file, the Relax
    flags `args` given after `--`."""
    if not file:
        if env:
            cmd.error("--env is for launch scripts (.sh): give the script")
        return JobFile(args=args or None)
    path = Path(file)
    if env and not is_launch_script(path):
        cmd.error(f"--env is for launch scripts (.sh); {escape(file)} is a job file")
    try:
        return load_job_file(
            path,
            script_env=_env_pairs(env),
            script_args=args,
            inherit_env=inherit_env,
            script_timeout=script_timeout,
        )
    except LaunchScriptError as e:
        cmd.err.print(f"[red]error[/red] {escape(str(e))}", highlight=False)
        if e.code in ("no_training_command", "exited", "timeout"):
            cmd.err.print(
                "[dim]nothing was submitted; relaxctl runs the script with bash, see `relaxctl submit --help`[/dim]"
            )
        raise typer.Exit(2) from None
    except JobFileError as e:
        cmd.error(escape(str(e)), highlight=False)


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            cmd.error(f"--env {escape(item)!r}: expected NAME=VALUE")
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
    cmd.out.print(
        f"launch script [bold]{escape(display_path(s.path))}[/bold]: training command at "
        f"[bold]{escape(where(s.file, s.line))}[/bold] ({escape(via + s.entrypoint)}, {len(s.argv)} words)",
        highlight=False,
    )
    for n, c in enumerate(s.skipped[:10]):
        label = "  not run: " if n == 0 else "           "
        cmd.out.print(f"{label}{escape(c.what)} ({escape(where(c.file, c.line))})", highlight=False)
    if len(s.skipped) > 10:
        cmd.out.print(f"           … and {len(s.skipped) - 10} more (--json lists them)")
    if s.neutralised:
        counts: dict[str, int] = {}
        for c in s.neutralised:
            counts[c.argv[0]] = counts.get(c.argv[0], 0) + 1
        summary = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in counts.items())
        cmd.out.print(f"  [dim]did nothing: {escape(summary)}[/dim]", highlight=False)
    for note in s.notes:
        cmd.out.print(f"  [yellow]note[/yellow] {escape(note)}", highlight=False)


def _labels(items: list[str] | None) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            cmd.error(f"label {item!r}: expected key=value")
        pairs[key] = value
    return pairs


@admin_app.command("create-pool")
@api_call()
def admin_create_pool(
    c: RelaxClient,
    name: str,
    accelerator: Annotated[str, typer.Option(help="e.g. h200, a100, cpu")],
    ray_address: Annotated[
        str | None, typer.Option(help="Ray Jobs API address of the pool's cluster.")
    ] = None,
    python: Annotated[str | None, typer.Option(help="Interpreter of the drivers on the cluster.")] = None,
    node: Annotated[list[str] | None, typer.Option(help="NAME:GPUS, repeatable.")] = None,
) -> None:
    """Create a pool of nodes (each NAME:GPUS)."""
    nodes = []
    for item in node or []:
        n, _, g = item.partition(":")
        if not g.isdigit():
            cmd.error(f"--node {item!r}: expected NAME:GPUS")
        nodes.append({"name": n, "gpus": int(g)})
    p = c.create_pool(name, accelerator, ray_address=ray_address, python=python, nodes=nodes)
    cmd.out.print(
        f"pool {p['name']}: {slots_phrase(p['total_gpus'], slot_kind(p['accelerator']))} "
        f"on {len(p['nodes'])} node(s)"
    )


@admin_app.command("set-node")
@api_call()
def admin_set_node(
    c: RelaxClient,
    pool: str,
    node: str,
    gpus: Annotated[
        int, typer.Option("--gpus", "--slots", help="Slots of the node: its GPUs (CPU slots in a cpu pool).")
    ],
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable.")] = None,
) -> None:
    """Add a node to a pool, or change its slots (GPUs, or CPU slots in a cpu pool) and labels."""
    p = c.put_node(pool, node, gpus, _labels(label))
    kind = slot_kind(p.get("accelerator")) if isinstance(p, dict) else None
    cmd.out.print(f"node {node} of pool {pool}: {slots_phrase(gpus, kind)}")


@admin_app.command("cordon")
@api_call()
def admin_cordon(
    c: RelaxClient,
    pool: str,
    node: str,
    undo: Annotated[bool, typer.Option("--undo", help="Uncordon.")] = False,
) -> None:
    """Keep new jobs off a node (running jobs stay); --undo lets them on again."""
    c.update_node(pool, node, cordoned=not undo)
    cmd.out.print(f"node {node} of pool {pool}: {'uncordoned' if undo else 'cordoned'}")


@admin_app.command("drain")
@api_call()
def admin_drain(c: RelaxClient, pool: str, node: str) -> None:
    """Cordon a node and requeue its jobs (each checkpoints, then resumes elsewhere)."""
    r = c.drain_node(pool, node)
    cmd.out.print(f"node {node} of pool {pool} drained; requeued: {', '.join(r['requeued']) or 'none'}")


@admin_app.command("node-down")
@api_call()
def admin_node_down(
    c: RelaxClient,
    pool: str,
    node: str,
    up: Annotated[bool, typer.Option("--up", help="Mark it up again.")] = False,
) -> None:
    """Mark a node lost (its jobs are requeued at once), or --up again."""
    r = c.update_node(pool, node, alive=up)
    cmd.out.print(
        f"node {node} of pool {pool}: {'up' if up else 'down'}; requeued: {', '.join(r['requeued']) or 'none'}"
    )


@admin_app.command("create-queue")
@api_call()
def admin_create_queue(
    c: RelaxClient,
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
) -> None:
    """Create a team's queue in a pool with its quota."""
    kinds = _pool_kinds(c)
    q = c.create_queue(
        name,
        pool,
        team,
        nominal_gpus,
        borrowing_limit=borrowing_limit,
        lending_limit=lending_limit,
        weight=weight,
    )
    cmd.out.print(
        f"queue {q['name']} of team {q['team']} in pool {q['pool']}: "
        f"nominal {slots_phrase(q['nominal_gpus'], kinds.get(q['pool']))}"
    )


@admin_app.command("priority-classes")
@api_call()
def admin_priority_classes(
    c: RelaxClient,
    create: Annotated[str | None, typer.Option(help="Create a class with this name.")] = None,
    value: Annotated[int, typer.Option(help="Its value (higher runs first).")] = 0,
    preemptible: Annotated[bool, typer.Option(help="Whether its jobs may be preempted.")] = True,
) -> Table:
    """List priority classes, or create one."""
    if create:
        c.create_priority_class(create, value, preemptible=preemptible)
    data = c.priority_classes()
    cols = [Col("class"), Col("value", right=True), Col("preemptible"), Col("description", wrap=True)]
    return Table(
        data,
        cols,
        lambda: [
            [p["name"], str(p["value"]), "yes" if p["preemptible"] else "no", p["description"] or ""]
            for p in data
        ],
    )


# admin grants -------------------------------------------------------------------------------
grants_app = typer.Typer(
    help="Paths outside a team's area that its jobs may read (ro) or read and write (rw).",
    no_args_is_help=True,
)
admin_app.add_typer(grants_app, name="grants")


@grants_app.command("list")
@api_call("json")
def admin_grants_list(
    c: RelaxClient,
    team: Annotated[str | None, typer.Option(help="Only this team's grants.")] = None,
) -> Table:
    """List path grants."""
    data = c.path_grants(team)
    cols = [Col("id"), Col("team"), Col("pool"), Col("mode"), Col("path")]
    return Table(
        data,
        cols,
        lambda: [[g["id"], g["team_id"], g["pool"] or "(every pool)", g["mode"], g["path"]] for g in data],
    )


@grants_app.command("add")
@api_call()
def admin_grants_add(
    c: RelaxClient,
    team: Annotated[str, typer.Argument(help="The team (name or id).")],
    path: Annotated[
        str, typer.Argument(help="An absolute path outside the platform's home and artifact store.")
    ],
    mode: Annotated[str, typer.Option(help="ro (read) or rw (read and write).")] = "ro",
    pool: Annotated[str | None, typer.Option(help="Only jobs in this pool (default: every pool).")] = None,
) -> None:
    """Let a team's jobs read (ro) or read and write (rw) PATH."""
    g = c.add_path_grant(team, path, mode=mode, pool=pool)
    where = f"pool {g['pool']}" if g["pool"] else "every pool"
    verb = "read and write" if g["mode"] == "rw" else "read"
    cmd.out.print(f"{g['id']}  team {g['team_id']} may {verb} {g['path']} in {where}")


@grants_app.command("remove")
@api_call()
def admin_grants_remove(c: RelaxClient, grant_id: str) -> None:
    """Remove a path grant (jobs already queued lose it when they next start)."""
    g = c.remove_path_grant(grant_id)
    cmd.out.print(f"removed {g['id']} ({g['mode']} {g['path']})")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
