"""`relaxctl`: the command line of Relax Platform (reads RELAX_URL and RELAX_API_KEY)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from client.jobfile import JobFile, JobFileError, is_launch_script, load_job_file
from client.launch_script import DEFAULT_TIMEOUT_S, LaunchScriptError, ResolvedScript
from client.sdk import ApiError, RelaxClient
from client.watch import watch_job

app = typer.Typer(
    help="Relax Platform: submit and watch LLM post-training jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
jobs_app = typer.Typer(help="List, inspect and cancel jobs.", no_args_is_help=True)
spec_app = typer.Typer(help="Validate job specs and print their schema.", no_args_is_help=True)
models_app = typer.Typer(help="Build models and datasets locally (no hub needed).", no_args_is_help=True)
admin_app = typer.Typer(help="Teams and API keys (admin key).", no_args_is_help=True)
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


@app.command()
def up() -> None:
    """Start the embedded platform here (API, scheduler, worker, local Ray, SQLite)."""
    os.execv(sys.executable, [sys.executable, "-m", "api.embedded"])


@app.command()
def dashboard(
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Only print the link.")] = False,
) -> None:
    """Open the web dashboard, signed in with your API key (the key travels in the URL fragment,
    which browsers never send to the server)."""
    import webbrowser

    c = _client(url, api_key)
    link = f"{c.url}/#key={c.api_key}" if c.api_key else f"{c.url}/"
    out.print(link, highlight=False)
    if not no_browser:
        webbrowser.open(link)


@app.command()
def metrics(
    job_id: str,
    names: Annotated[list[str] | None, typer.Option("--name", "-n", help="Only these metrics.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every metric of a job: first, last, min and max value and the number of points."""
    with _client(url, api_key) as c:
        try:
            series = c.metrics(job_id, names=names)
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(series)
        return
    t = Table("metric", "points", "first", "last", "min", "max", "last step")
    for name, pts in sorted(series.items()):
        vals = [p["value"] for p in pts]
        t.add_row(
            name,
            str(len(pts)),
            f"{vals[0]:.4g}",
            f"{vals[-1]:.4g}",
            f"{min(vals):.4g}",
            f"{max(vals):.4g}",
            str(pts[-1]["step"]),
        )
    out.print(t)


@app.command()
def pools(url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Pools, their nodes and what is allocated on each."""
    with _client(url, api_key) as c:
        try:
            data = c.pools()
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(data)
        return
    t = Table("pool", "accelerator", "node", "gpus", "allocated", "state", "jobs", "ray")
    for p in data:
        for n in p["nodes"]:
            state = "cordoned" if n["cordoned"] or p["cordoned"] else ("up" if n["alive"] else "down")
            t.add_row(
                p["name"],
                p["accelerator"],
                n["name"],
                str(n["gpus"]),
                str(n["allocated_gpus"]),
                state,
                ", ".join(f"{j['job_id']} ({j['gpus']})" for j in n.get("jobs", [])) or "-",
                p["ray_address"] or "-",
            )
    out.print(t)


@app.command()
def queues(url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Queues with their quota and usage."""
    with _client(url, api_key) as c:
        try:
            data = c.queues()
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(data)
        return
    t = Table("queue", "pool", "team", "used / nominal", "borrowed", "running", "queued (GPUs)", "weight")
    for q in data:
        t.add_row(
            q["name"],
            q["pool"],
            q["team"],
            f"{q['used_gpus']} / {q['nominal_gpus']}",
            str(q.get("borrowed_gpus", 0)),
            str(q.get("running_jobs", 0)),
            f"{q['queued_jobs']} ({q.get('queued_gpus', 0)})",
            f"{q['weight']:g}",
        )
    out.print(t)


# jobs ---------------------------------------------------------------------------------------
@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="Comma-separated statuses.")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 20,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Newest jobs first."""
    with _client(url, api_key) as c:
        try:
            page = c.list_jobs(status=status, name=name, limit=limit)
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(page)
        return
    t = Table("id", "name", "status", "queue", "gpus", "progress", "created", "why waiting / reason")
    for j in page["data"]:
        progress = f"{j['progress_step']}/{j['total_steps']}" if j["total_steps"] else "-"
        why = j["wait_reason"] if j["status"] == "QUEUED" else (j["status_reason"] or "")
        t.add_row(
            j["id"],
            j["name"],
            j["status"],
            j["queue"],
            str(j["total_gpus"]),
            progress,
            j["created_at"][:19].replace("T", " "),
            why[:60],
        )
    out.print(t)


@jobs_app.command("get")
def jobs_get(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """A job with its spec, demand, allocation and events."""
    with _client(url, api_key) as c:
        try:
            job = c.get_job(job_id)
            events = c.events(job_id)
        except ApiError as e:
            _fail(e)
            return
    if as_json:
        _print_json(job | {"events": events})
        return
    out.print(
        f"[bold]{job['id']}[/bold] {job['name']}  [bold]{job['status']}[/bold]"
        + (f" ({job['failure_reason']})" if job["failure_reason"] else "")
    )
    out.print(
        f"  queue {job['queue']} · pool {job['pool']} · {job['total_gpus']} slot(s) · attempt {job['attempt']}"
    )
    if job["status"] == "QUEUED" and job["wait_reason"]:
        out.print(f"  waiting: #{job['queue_position']} — {job['wait_reason']}")
    if job["total_steps"]:
        out.print(f"  progress: step {job['progress_step']} of {job['total_steps']}")
    out.print(f"  outputs: {job['output_dir']}")
    t = Table("time", "transition", "reason")
    for e in events:
        what = f"{e['from_status'] or '·'} → {e['to_status']}" if e["kind"] == "transition" else e["kind"]
        t.add_row(e["time"][11:23], what, e["reason"] or "")
    out.print(t)


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel a job; a running one stops its Ray job and frees its slots."""
    with _client(url, api_key) as c:
        try:
            job = c.cancel_job(job_id)
        except ApiError as e:
            _fail(e)
            return
    out.print(f"{job['id']}: {job['status']}")


@jobs_app.command("logs")
def jobs_logs(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """The driver's log lines (and Ray's output of a failed driver)."""
    with _client(url, api_key) as c:
        after = 0
        while True:
            try:
                page = c.logs(job_id, after=after)
            except ApiError as e:
                _fail(e)
                return
            for line in page["data"]:
                out.print(
                    f"[dim]{line['time'][11:23]} {line['source']:>6}[/dim] {escape(line['message'])}",
                    highlight=False,
                )
            after = page["next_after"]
            if not follow:
                return
            if not page["data"]:
                if c.get_job(job_id)["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    return
                time.sleep(1.0)


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
            out.print(
                f"[green]valid[/green] · would queue in {res['queue']} on pool {res['pool']} · "
                f"demand: {d.get('summary') or d.get('total_gpus')}"
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
        Path | None, typer.Option("--out", help="Artifact root (default: $RELAX_HOME/artifacts).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build the tiny Qwen2-style model + tokenizer (artifacts://models/tiny) and the arithmetic
    datasets (artifacts://datasets/arith/…) offline."""
    from runtime.data.arith import write_datasets
    from runtime.models.tiny import build_tiny_model

    root = out_dir or Path(os.environ.get("RELAX_HOME", ".relax")).expanduser() / "artifacts"
    t0 = time.time()
    model = build_tiny_model(root / "models" / "tiny", seed=seed)
    files = write_datasets(root / "datasets" / "arith")
    out.print(f"model   artifacts://models/tiny  -> {model}")
    for name, path in files.items():
        out.print(f"dataset artifacts://datasets/arith/{Path(path).name}  ({name}) -> {path}")
    out.print(f"[dim]built in {time.time() - t0:.1f}s[/dim]")


# admin --------------------------------------------------------------------------------------
@admin_app.command("teams")
def admin_teams(
    create: Annotated[str | None, typer.Option(help="Create a team.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List teams, or create one."""
    with _client(url, api_key) as c:
        try:
            if create:
                c.create_team(create)
            data = c.teams()
        except ApiError as e:
            _fail(e)
            return
    for t in data:
        out.print(f"{t['id']}  {t['name']}")


@admin_app.command("create-key")
def admin_create_key(
    name: str,
    team: Annotated[str | None, typer.Option()] = None,
    role: Annotated[str, typer.Option()] = "member",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create an API key (the secret is printed once)."""
    with _client(url, api_key) as c:
        try:
            k = c.create_api_key(name, role=role, team=team)
        except ApiError as e:
            _fail(e)
            return
    out.print(k["key"])


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
    out.print(f"pool {p['name']}: {p['total_gpus']} GPUs on {len(p['nodes'])} node(s)")


@admin_app.command("set-node")
def admin_set_node(
    pool: str,
    node: str,
    gpus: Annotated[int, typer.Option(help="GPUs of the node.")],
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Add a node to a pool, or change its GPUs and labels."""
    with _client(url, api_key) as c:
        _admin(lambda: c.put_node(pool, node, gpus, _labels(label)))
    out.print(f"node {node} of pool {pool}: {gpus} GPUs")


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
    nominal_gpus: Annotated[int, typer.Option(help="Guaranteed GPUs.")],
    borrowing_limit: Annotated[
        int | None, typer.Option(help="Most GPUs above nominal it may borrow.")
    ] = None,
    lending_limit: Annotated[
        int | None, typer.Option(help="Most idle nominal GPUs others may borrow.")
    ] = None,
    weight: Annotated[float, typer.Option(help="Fair-share weight.")] = 1.0,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create a team's queue in a pool with its quota."""
    with _client(url, api_key) as c:
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
    out.print(f"queue {q['name']} of team {q['team']} in pool {q['pool']}: nominal {q['nominal_gpus']} GPUs")


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
    t = Table("class", "value", "preemptible", "description")
    for p in data:
        t.add_row(p["name"], str(p["value"]), "yes" if p["preemptible"] else "no", p["description"] or "")
    out.print(t)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
