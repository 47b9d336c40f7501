"""The Ray job entrypoint: reads the spec, starts the roles, runs the RL (GRPO) or SFT loop, reports."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import httpx
import ray

from runtime.capabilities import unsupported_parameters
from runtime.credential import (
    CredentialError,
    JobCredential,
    Retry,
    exchange,
    take_bootstrap_secret,
    with_retries,
)
from runtime.devices import Device
from runtime.observability import Stage, StepTimer, configure_logging
from runtime.pipeline import Pipeline, RLPipeline, SFTPipeline, build_pipeline, role_plan
from runtime.redaction import install_log_redaction
from runtime.reporter import EventKind, HttpReporter, LocalReporter, Reporter
from runtime.roles.placement import plan_topology
from runtime.spec import RuntimeSpec, load_spec_with_warnings, parameter_defaults, read_spec_file
from runtime.spool import spool_dir
from runtime.trackers import Trackers, open_trackers

log = logging.getLogger("runtime.driver")
DRAIN_ENV = "RELAX_REPORT_DRAIN_SECONDS"
DEFAULT_DRAIN_S = 60.0


# ---- the loops: one screen each ------------------------------------------------------------------------------
def run_rl(p: RLPipeline, start: int) -> None:
    """RL: rollout (data, generate, reward, filter) -> log-probs -> values (PPO's critic) -> advantages ->
    train -> weight sync, with periodic save and eval. Modes (fully-async, debug) are stage
    implementations chosen at build."""
    p.begin(start)
    p.reporter.metrics(start, p.evaluate(start))
    for rollout_id in range(start, p.total_rollouts):
        t = StepTimer()
        with t.stage(Stage.ROLLOUT):
            rollout = p.collect_rollout(rollout_id)
        with t.stage(Stage.LOG_PROBS):
            batch = p.log_probs(rollout)
        with t.stage(Stage.VALUES):
            batch = p.values(batch)
        with t.stage(Stage.ADVANTAGES):
            batch = p.compute_advantages(batch)
        with t.stage(Stage.TRAIN):
            train_metrics = p.train(rollout_id, batch)
        with t.stage(Stage.WEIGHT_SYNC):
            p.sync_weights(rollout_id)
        with t.stage(Stage.SAVE):
            p.save_step(rollout_id, rollout, batch)
        with t.stage(Stage.EVAL):
            eval_metrics = p.evaluate(rollout_id + 1)
        t.finish()
        p.report_step(rollout_id, rollout, batch, train_metrics, t)
        p.reporter.metrics(rollout_id + 1, eval_metrics)
        if stop_requested(p, rollout_id):
            return
    finish(p)


def run_sft(p: SFTPipeline, start: int) -> None:
    """SFT: next batch of examples -> train (loss on assistant tokens only), with periodic save,
    perplexity eval and predictions."""
    for rollout_id in range(start, p.total_rollouts):
        t = StepTimer()
        with t.stage(Stage.DATA):
            batch = p.next_batch()
        with t.stage(Stage.TRAIN):
            train_metrics = p.train(rollout_id, batch)
        with t.stage(Stage.SAVE):
            p.save_step(rollout_id, batch)
        with t.stage(Stage.EVAL):
            eval_metrics = p.evaluate(rollout_id)
        t.finish()
        p.report_step(rollout_id, batch, train_metrics, t)
        p.reporter.metrics(rollout_id + 1, eval_metrics)
        if stop_requested(p, rollout_id):
            return
    finish(p)


def stop_requested(p: Pipeline, rollout_id: int) -> bool:
    """Between steps: if the platform (or SIGTERM) asked us to stop, checkpoint and leave cleanly."""
    if not p.reporter.stop_requested:
        return False
    log.warning("stop requested after step %d: saving and exiting", rollout_id + 1)
    p.reporter.event(EventKind.STOP_REQUESTED, f"after step {rollout_id + 1}")
    p.save(rollout_id, blocking=True)  # checkpoint under `save` and export under `save-hf`, whichever is set
    return True


def finish(p: Pipeline) -> None:
    """The last state is always kept: a final checkpoint under `save`, a final HF export under `save-hf`."""
    p.finish()
    p.reporter.event(EventKind.FINISHED, f"{p.total_rollouts} steps")


# ---- process plumbing -------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runtime.driver", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job-id", help="platform mode: fetch the spec from the API and report to it")
    source.add_argument("--spec-file", type=Path, help="standalone mode: a .json/.yaml job file")
    parser.add_argument("--api-url", help="platform API base URL (platform mode)")
    parser.add_argument(
        "--report-dir",
        type=Path,
        help="standalone: where metrics.jsonl/reports.jsonl go (default <save>/../report)",
    )
    parser.add_argument(
        "--ray-address", help="join this Ray cluster (default: $RAY_ADDRESS, else a private one)"
    )
    args = parser.parse_args(argv)
    if args.job_id and not args.api_url:
        parser.error("--job-id needs --api-url")
    return args


def fetch_spec(api_url: str, job_id: str, token: str, *, deadline_s: float = 120.0) -> dict[str, Any]:
    """GET the normalized spec, retrying while the API is briefly unavailable."""
    return dict(fetch_job(api_url, job_id, token, deadline_s=deadline_s)["spec"])


def fetch_job(api_url: str, job_id: str, token: str, *, deadline_s: float = 120.0) -> dict[str, Any]:
    """GET `{job_id, name, attempt, spec, output_dir}`, retrying while the API is briefly unavailable."""
    url = f"{api_url.rstrip('/')}/v1/internal/jobs/{job_id}/spec"

    def attempt() -> dict[str, Any]:
        try:
            response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        except httpx.HTTPError as exc:
            raise Retry(str(exc)) from exc
        if response.is_success:
            return dict(response.json())
        if response.status_code in (401, 403, 404):
            raise RuntimeError(f"GET {url}: HTTP {response.status_code} {response.text[:200]}")
        raise Retry(f"HTTP {response.status_code}")

    return with_retries(
        attempt,
        deadline_s=deadline_s,
        what="spec fetch",
        logger=log,
        give_up=lambda problem: RuntimeError(f"GET {url} failed for {deadline_s:.0f}s: {problem}"),
    )


def load_job_spec(raw: dict[str, Any], *, name: str | None, normalized: bool) -> RuntimeSpec:
    """The job's spec (`runtime.spec.load_spec`), logging each warning of jobspec's rules once, with its
    code (a spec file's; a platform job's were given at submission)."""
    spec, warnings = load_spec_with_warnings(raw, name=name, normalized=normalized)
    for issue in warnings:
        hint = f" ({issue.hint})" if issue.hint else ""
        log.warning("spec warning %s: %s%s", issue.code, issue.message, hint)
    return spec


def check_capabilities(spec: RuntimeSpec) -> None:
    """Refuse, by name, parameters set to something the job's backend does not implement."""
    defaults = parameter_defaults()
    if defaults is None:
        return
    refused = unsupported_parameters(spec.values(), defaults)
    if refused:
        raise ValueError(f"the {spec.train_backend} backend does not implement: {', '.join(refused)}")


def init_ray(address: str | None, spec: RuntimeSpec) -> bool:
    """Connect to Ray; returns whether this driver owns the connection (and shuts it down at the end).
    A process already connected (a test harness, a notebook) is reused as is."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return True
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private single-user cluster
    plan = role_plan(spec, 1)
    topology = plan_topology(
        spec.resource,
        colocate=spec.colocated,
        with_rollout=spec.starts_engines,
        with_train=spec.trains,
        device=Device.detect(),
        separate_roles=tuple(plan.separate),
        with_critic=spec.has_critic,
        train_world=plan.train_world,
        critic_world=plan.critic.world if plan.critic is not None else None,
        demand=plan.demand,
    )
    ray.init(
        address="local",
        num_cpus=max(4, topology.num_bundles),
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return True


def drain_seconds() -> float:
    """How long the driver's exit waits for the platform to acknowledge its last reports
    (`$RELAX_REPORT_DRAIN_SECONDS`, default 60); what is left then stays in the spool, which the platform
    collects once the Ray job has ended."""
    try:
        return max(0.0, float(os.environ.get(DRAIN_ENV, "") or DEFAULT_DRAIN_S))
    except ValueError:
        return DEFAULT_DRAIN_S


def attach_spool(reporter: HttpReporter, job: dict[str, Any], attempt: int) -> None:
    """Put the reporter's queue on disk under the job's folder (runtime/spool.py)."""
    output_dir = job.get("output_dir")
    if not output_dir:
        log.warning("the platform named no job folder: reports wait in memory only (no spool)")
        return
    try:
        reporter.attach_spool(spool_dir(output_dir, attempt))
    except OSError as exc:
        log.warning("no report spool under %s (%s): reports wait in memory only", output_dir, exc)


def main(argv: list[str] | None = None, *, credential: JobCredential | None = None) -> int:
    """`credential`: the attempt's token, already exchanged by runtime.bootstrap (the Ray job's entrypoint);
    without it, platform mode exchanges the bootstrap secret of the environment here."""
    install_log_redaction()
    args = parse_args(argv)
    standalone = args.spec_file is not None
    raw: dict[str, Any] = {}
    name = None
    if standalone:
        raw, name = read_spec_file(args.spec_file)
        save = raw.get("save")
        report_dir = args.report_dir or (
            Path(save).parent / "report" if save else Path.cwd() / "relax-report"
        )
        reporter: Reporter = LocalReporter(report_dir)
        job = name or args.spec_file.stem
        output_dir: str | Path | None = Path(report_dir).parent  # where the trackers write
    else:
        if credential is None:  # started as `python -m runtime.driver`, not through runtime.bootstrap
            try:
                credential = exchange(args.api_url, args.job_id, take_bootstrap_secret())
            except CredentialError as exc:
                log.error("job %s: %s", args.job_id, exc)
                return 1
        reporter = HttpReporter(args.api_url, args.job_id, credential.token, attempt=credential.attempt)
        job = args.job_id
        output_dir = None
    run_name = job
    configure_logging(reporter, job=job)
    signal.signal(signal.SIGTERM, lambda *_: reporter.request_stop())
    pipeline: Pipeline | None = None
    trackers: Trackers | None = None
    owns_ray = False
    code = 0
    try:
        if not standalone:
            assert credential is not None and isinstance(reporter, HttpReporter)
            fetched = fetch_job(args.api_url, args.job_id, credential.token)
            attach_spool(reporter, fetched, credential.attempt)
            raw = dict(fetched["spec"])
            output_dir, run_name = fetched.get("output_dir"), fetched.get("name") or job
        spec = load_job_spec(raw, name=name, normalized=not standalone)
        check_capabilities(spec)
        log.info(
            "job %s: %s on %s, %s",
            job,
            "SFT"
            if spec.is_sft
            else spec.advantage_estimator + (" (fully-async)" if spec.fully_async else ""),
            spec.train_backend,
            spec.hf_checkpoint,
        )
        owns_ray = init_ray(args.ray_address or os.environ.get("RAY_ADDRESS"), spec)
        pipeline = build_pipeline(spec, reporter)
        start = pipeline.resume()
        trackers = open_trackers(
            spec.values(),
            output_dir=output_dir,
            run_name=run_name,
            start_step=start,
        )
        reporter.add_sink(trackers)
        if isinstance(pipeline, SFTPipeline):
            run_sft(pipeline, start)
        else:
            run_rl(pipeline, start)
    except Exception as exc:
        log.exception("driver failed: %s: %s", type(exc).__name__, exc)
        reporter.event(EventKind.FAILED, f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        if pipeline is not None:
            pipeline.close()
        if trackers is not None:
            trackers.close()
        # The last report carries the end marker: the platform marks the job SUCCEEDED only once it is
        # stored (scheduler/tasks.py::reconcile_pool), whether it arrives now or from the spool later.
        outcome = "failed" if code else ("stopped" if reporter.stop_requested else "finished")
        reporter.close(timeout=drain_seconds(), final=f"exit {code}: {outcome}")
        if owns_ray and ray.is_initialized():
            ray.shutdown()
    return code


def exit_process(code: int) -> NoReturn:
    """End the driver's process with `code`, skipping the interpreter's last garbage collection: by now every
    report is delivered or spooled and the trackers and Ray are shut down, and a collection over the objects
    of torch, transformers and Ray would keep the process ~1 s longer (measured 1.1 s -> 0.15 s from the end
    of main to exit), which the Ray job (and the platform, to see the job end) waits for. atexit handlers
    still run and buffered output is still flushed; only objects in reference cycles are not finalized, as
    Python never promises at exit."""
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
