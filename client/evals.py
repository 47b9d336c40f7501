"""`relaxctl eval` (run a CI eval, wait for its verdict, write JUnit XML) and `relaxctl evals list|get`
(docs/reference/evals.md). With --wait the exit code is the verdict: 0 passed, 1 failed, 2 error."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape

from client import commands as cmd
from client.commands import Table, api_call
from client.display import Col
from client.sdk import RelaxClient
from wire.jobs import JobStatus

evals_app = typer.Typer(help="CI evals: a model's eval history, one eval's verdicts.", no_args_is_help=True)

EXIT = {"passed": 0, "failed": 1, "error": 2}
#: Relax flags the eval takes itself (the rest after `--` go to its spec).
_OWN_FLAGS = {"eval-prompt-data", "eval-config", "n-samples-per-eval-prompt", "log-passrate"}


def relax_flags(words: list[str]) -> tuple[list[str], str | None, int | None, bool | None, dict[str, Any]]:
    """Relax flags after `--` -> (eval-prompt-data pairs, eval-config, n-samples-per-eval-prompt, log-passrate,
    the other flags as spec values: one word a value (YAML-read: numbers, booleans), several a list, none true)."""
    groups: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--") and len(word) > 2:
            flag, _, value = word[2:].partition("=")
            groups.append((flag, [value] if value else []))
        elif groups:
            groups[-1][1].append(word)
        else:
            cmd.error(f"{escape(word)!r} after `--` is no Relax flag: give flags as --name value")
    pairs: list[str] = []
    config = None
    samples = None
    passrate = None
    spec: dict[str, Any] = {}
    for flag, values in groups:
        if flag == "eval-prompt-data":
            pairs += values
        elif flag == "eval-config" and len(values) == 1:
            config = values[0]
        elif flag == "n-samples-per-eval-prompt" and len(values) == 1 and values[0].isdigit():
            samples = int(values[0])
        elif flag == "log-passrate":
            passrate = not values or str(yaml.safe_load(values[0])).lower() == "true"
        elif flag in _OWN_FLAGS:
            cmd.error(f"--{flag} takes one value")
        else:
            parsed = [_value(v) for v in values]
            spec[flag] = True if not parsed else parsed[0] if len(parsed) == 1 else parsed
    return pairs, config, samples, passrate, spec


def _value(word: str) -> Any:
    """A flag's value as YAML reads it (0.6, true, {"rollout": [1, 1]}); blank or unreadable, the word itself."""
    if not word.strip():
        return word
    try:
        return yaml.safe_load(word)
    except yaml.YAMLError:
        return word


@api_call("json")
def run_eval(
    c: RelaxClient,
    ctx: typer.Context,
    threshold: Annotated[
        list[str],
        typer.Option(
            "--threshold",
            "-t",
            help="`METRIC OP NUMBER` (OP >=, >, <=, <, ==), e.g. 'eval/gsm8k >= 0.6'; repeat.",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            help="A model folder your team may read: artifacts://models/tiny, job://<job>/hf, file://<id>."
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(help="Evaluate one of your jobs (id or name): its export, or --step's checkpoint."),
    ] = None,
    step: Annotated[int | None, typer.Option(help="With --job: the checkpoint of this step.")] = None,
    eval_prompt_data: Annotated[
        list[str] | None,
        typer.Option(
            "--eval-prompt-data",
            "-d",
            help="An eval set NAME=PATH (PATH e.g. artifacts://data/x.jsonl); repeat.",
        ),
    ] = None,
    eval_config: Annotated[
        str | None, typer.Option(help="Relax's --eval-config file (artifacts://...).")
    ] = None,
    n_samples: Annotated[
        int, typer.Option("--n-samples-per-eval-prompt", "-n", help="Samples per prompt.")
    ] = 1,
    pass_at_k: Annotated[
        bool | None,
        typer.Option("--pass-at-k/--no-pass-at-k", help="eval/<name>-pass@k (default: when n > 1)."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Another Relax parameter of the eval job, KEY=VALUE (rm-type=math); repeat."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="The eval's name (default: eval-<model>).")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue (default: your team's first).")] = None,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="Default: eval (before your team's training jobs).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the verdict; exit 0 passed, 1 failed, 2 error.")
    ] = False,
    junit: Annotated[
        Path | None, typer.Option(help="With --wait: write JUnit XML here (one testcase per threshold).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="With --wait: give up (exit 2) after this many seconds.")
    ] = None,
    *,
    as_json: bool,
) -> None:
    """Evaluate a model on eval sets against thresholds, as a high-priority eval job. Relax flags may follow
    `--` (--eval-prompt-data NAME PATH ..., --eval-temperature 0, --rm-type math, ...)."""
    pairs, config, samples, passrate, spec = relax_flags(list(ctx.args))
    for item in eval_prompt_data or []:
        ds_name, sep, path = item.partition("=")
        if not sep or not ds_name or not path:
            cmd.error(f"--eval-prompt-data {escape(item)!r}: give NAME=PATH")
        pairs += [ds_name, path]
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            cmd.error(f"--set {escape(item)!r}: give KEY=VALUE")
        spec[key.lstrip("-")] = _value(value)
    if junit is not None and not wait:
        cmd.error("--junit needs --wait (the verdict is written once the eval ends)")
    ev = c.create_eval(
        thresholds=list(threshold),
        model_path=model,
        model_job=job,
        checkpoint_step=step,
        eval_prompt_data=pairs or None,
        eval_config=eval_config or config,
        n_samples_per_eval_prompt=samples or n_samples,
        pass_at_k=pass_at_k if pass_at_k is not None else passrate,
        spec=spec or None,
        name=name,
        queue=queue,
        priority_class=priority_class,
    )
    if not wait:
        if as_json:
            cmd.print_json(ev)
        else:
            cmd.out.print(f"{ev['id']}  {ev['name']}  running as job {ev['job_id']} ({ev['job_status']})")
        return
    cmd.err.print(f"{ev['id']}: eval job {ev['job_id']} submitted")

    def changed(e: dict[str, Any]) -> None:
        cmd.err.print(f"  job {e['job_id']}: {e.get('job_status')}")

    try:
        ev = c.wait_eval(ev["id"], timeout=timeout, on_change=changed)
    except TimeoutError as exc:
        cmd.error(str(exc), code=2)
    if junit is not None:
        write_junit(ev, junit)
    if as_json:
        cmd.print_json(ev)
    else:
        print_verdict(ev)
    raise typer.Exit(EXIT.get(ev["outcome"], 2))


def print_verdict(ev: dict[str, Any]) -> None:
    colour = {"passed": "green", "failed": "red"}.get(ev["outcome"], "yellow")
    cmd.out.print(
        f"[{colour}]{ev['outcome'].upper()}[/{colour}]  {ev['name']}  ({ev['id']}, job {ev['job_id']})"
    )
    for t in ev["thresholds"]:
        actual = "—" if t.get("actual") is None else f"{t['actual']:.4g}"
        cmd.out.print(
            f"  {t['verdict']:<8} {t['metric']} {t['op']} {t['value']:g}  (got {actual})", highlight=False
        )
    if ev.get("reason"):
        cmd.out.print(f"  {ev['reason']}", highlight=False)


def write_junit(ev: dict[str, Any], path: Path) -> None:
    """JUnit XML of an ended eval: one testsuite, one testcase per threshold (a failure when it does not hold, an
    error when the metric is missing or the job failed)."""
    thresholds = ev["thresholds"]
    failures = sum(t["verdict"] == "fail" for t in thresholds)
    errors = sum(t["verdict"] not in ("pass", "fail") for t in thresholds)
    seconds = _seconds(ev)
    suite = ET.Element(
        "testsuite",
        name=f"relax.eval.{ev['name']}",
        tests=str(len(thresholds)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{seconds:.3f}",
        timestamp=str(ev.get("created_at") or ""),
    )
    props = ET.SubElement(suite, "properties")
    for key in ("id", "job_id", "model_key", "outcome"):
        ET.SubElement(props, "property", name=f"eval.{key}", value=str(ev.get(key) or ""))
    for t in thresholds:
        case = ET.SubElement(
            suite, "testcase", classname=f"relax.eval.{ev['name']}", name=f"{t['metric']} {t['op']} {t['value']:g}",
            time=f"{seconds:.3f}",
        )  # fmt: skip
        actual = t.get("actual")
        if t["verdict"] == "fail":
            message = f"{t['metric']} = {actual:.6g}, needs {t['op']} {t['value']:g}"
            ET.SubElement(case, "failure", message=message, type="threshold").text = message
        elif t["verdict"] != "pass":
            message = (
                f"{t['metric']} was not reported" if ev["outcome"] != "error" or ev.get("job_status") == JobStatus.SUCCEEDED
                else str(ev.get("reason") or "the eval job failed")
            )  # fmt: skip
            ET.SubElement(case, "error", message=message, type="eval_error").text = message
        else:
            ET.SubElement(case, "system-out").text = f"{t['metric']} = {actual:.6g}"
    tree = ET.ElementTree(ET.Element("testsuites", name="relax-evals"))
    tree.getroot().append(suite)
    ET.indent(tree)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _seconds(ev: dict[str, Any]) -> float:
    try:
        start = datetime.fromisoformat(str(ev["created_at"]))
        end = datetime.fromisoformat(str(ev["finished_at"]))
    except (KeyError, TypeError, ValueError):
        return 0.0
    return max(0.0, (end - start).total_seconds())


@evals_app.command("list")
@api_call("json", "wide")
def evals_list(
    c: RelaxClient,
    model: Annotated[str | None, typer.Option(help="One model's history: its model_key.")] = None,
    outcome: Annotated[str | None, typer.Option(help="running, passed, failed or error.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
) -> Table:
    """Your team's evals, newest first: each one's verdict and metrics."""
    data = c.list_evals(model=model, outcome=outcome, limit=limit)["data"]
    cols = [
        Col("id"),
        Col("name"),
        Col("outcome"),
        Col("model", drop=2),
        Col("thresholds", wrap=True),
        Col("created", drop=1),
    ]
    return Table(
        data,
        cols,
        lambda: [
            [
                e["id"],
                e["name"],
                e["outcome"],
                e["model_key"],
                ", ".join(f"{t['metric']}:{t['verdict']}" for t in e["thresholds"]),
                str(e["created_at"])[:19].replace("T", " "),
            ]
            for e in data
        ],
    )


@evals_app.command("get")
@api_call("json")
def evals_get(c: RelaxClient, eval_id: str, *, as_json: bool = False) -> None:
    """One eval: each threshold's verdict and the metrics."""
    ev = c.get_eval(eval_id)
    if as_json:
        cmd.print_json(ev)
    else:
        print_verdict(ev)
