"""What every `relaxctl` command shares: the consoles, the common options, how an API error becomes a message and an
exit code, and the frame of a command that calls the API (`api_call`), so that a command states only what it
asks and what it prints.

A command that calls the API takes the client first and returns a `Table` (or prints itself):

    @app.command()
    @api_call("json", "wide")
    def pools(c: RelaxClient) -> Table:
        data = c.pools()
        return Table(data, [Col("pool"), ...], lambda: [[p["name"], ...] for p in data])

`api_call` adds --url and --api-key (and --json, --wide) after the command's own options, opens the client,
prints the table (or with --json the data as the API gave it) and turns an `ApiError` raised anywhere in the
command into `fail`'s message and exit code (2 for a request the API refused as invalid, else 1)."""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from client.display import Col, print_table
from client.sdk import ApiError, RelaxClient

# Typer 0.29's help panel prints a type after every option, flags included (`--wait <bool>`), as if they took a
# value: a flag (or a counter) shows none.
_option_type = typer.core.TyperOption.display_type_rich


def _flag_shows_no_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag or self.count else _option_type(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_shows_no_type  # type: ignore[method-assign]

#: Where commands print (tests put narrower or wider consoles here).
out = Console()
err = Console(stderr=True)


def connect(url: str | None, key: str | None) -> RelaxClient:
    """The API client of one command (tests put one speaking to an in-process API here)."""
    return RelaxClient(url, key)


# ---- options -------------------------------------------------------------------------------------------------
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
JobArg = Annotated[
    str, typer.Argument(metavar="JOB", help="The job's id, or its name where one of your jobs has it.")
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


# ---- errors and output ---------------------------------------------------------------------------------------
def error(message: str, code: int = 2, *, highlight: bool | None = None) -> NoReturn:
    """`error <message>` on stderr, then exit (2: the command was given something it cannot use)."""
    err.print(f"[red]error[/red] {message}", highlight=highlight)
    raise typer.Exit(code)


def fail(e: ApiError) -> NoReturn:
    """An API error: its message and code, each issue of a spec it refused with its hint; exit code 2 for a
    request the API found invalid (400, 409, 422), else 1."""
    err.print(f"[red]error[/red] {e.message}" + (f"  [dim]({e.code})[/dim]" if e.code else ""))
    for issue in e.issues:
        where = issue.get("field") or ""
        tag = "[yellow]warning[/yellow] " if issue.get("severity") == "warning" else ""
        err.print(f"  - {tag}[bold]{where}[/bold]: {issue.get('message', '')}")
        if issue.get("hint"):
            err.print(f"    hint: {issue['hint']}")
    raise typer.Exit(2 if e.status in (400, 409, 422) else 1)


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


@dataclass(frozen=True)
class Table:
    """What a listing command returns: `data` as the API gave it (--json prints it unchanged) and the table of it,
    `cols` and `rows`, a function called only when the table is printed (it may ask the API more, e.g. the slot
    kinds of the pools)."""

    data: Any
    cols: Sequence[Col]
    rows: Callable[[], Sequence[Sequence[str]]]


JOB_ID = re.compile(r"job_[0-9a-f]{20}")


def job_id(c: RelaxClient, ref: str) -> str:
    """A job's id from its id, or from its name where one job of those the key can see has it."""
    if JOB_ID.fullmatch(ref):
        return ref
    named = c.list_jobs(name=ref, limit=6)["data"]
    if len(named) == 1:
        return str(named[0]["id"])
    if not named:
        error(f"no job has the id or name {escape(ref)!r} (`relaxctl jobs list` shows yours)")
    err.print(
        f"[red]error[/red] {len(named)}{'+' if len(named) > 5 else ''} jobs are named {escape(ref)!r}: give the id"
    )
    for j in named[:5]:
        out.print(
            f"  {j['id']}  {j['status']:<10} {j.get('team', '')}  {j['created_at'][:19].replace('T', ' ')}"
        )
    raise typer.Exit(2)


# ---- the frame of a command that calls the API ---------------------------------------------------------------
def _option(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_ADDED = {
    "json": _option("as_json", JsonOpt, False),
    "wide": _option("wide", WideOpt, False),
}


def api_call(*options: Literal["json", "wide"]) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Make `fn(c, ...)` a command that calls the API (see the module's docstring). The command's options are
    `fn`'s own, after them --url and --api-key, then those named in `options` (`json`: --json, `wide`: --wide).
    `fn` receives the client `c` and its own options; keyword-only parameters `as_json` and `wide` receive those
    options' values. A `Table` it returns is printed: its data with --json, else its table (with --wide every
    column; without, a note on stderr names the columns left out)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        _, *params = sig.parameters.values()  # the first is the client
        own = [p for p in params if p.kind is not p.KEYWORD_ONLY]
        told = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        added = [_option("url", UrlOpt), _option("api_key", KeyOpt), *(_ADDED[o] for o in options)]
        if not told <= {p.name for p in added[2:]}:
            raise TypeError(f"{fn.__name__}: keyword-only {sorted(told)} must be options api_call adds")

        @functools.wraps(fn)
        def command(*args: Any, url: str | None, api_key: str | None, **kw: Any) -> None:
            shown = {"as_json": kw.pop("as_json", False), "wide": kw.pop("wide", False)}
            with connect(url, api_key) as c:
                try:
                    result = fn(c, *args, **kw, **{k: v for k, v in shown.items() if k in told})
                    if isinstance(result, Table) and shown["as_json"]:
                        print_json(result.data)
                    elif isinstance(result, Table):
                        wide = shown["wide"]
                        note = err if "wide" in options else None
                        print_table(out, result.cols, result.rows(), wide=wide, note=note)
                except ApiError as e:
                    fail(e)

        command.__signature__ = sig.replace(parameters=[*own, *added], return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
        return command

    return decorate
