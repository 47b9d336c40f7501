"""The one builder: reads the data, starts the roles, builds the RL or SFT pipeline the spec asks for, and
reports the job as running. The spec it gets has passed `jobspec`'s rules (at submission, or in
`runtime.spec.load_spec` for a spec file), which hold every spec rule: nothing is re-checked here."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import transformers
from transformers import AutoTokenizer

from runtime.access import check_paths
from runtime.data.prompts import (
    PromptFormatter,
    PromptItem,
    drop_long_prompts,
    read_prompt_items,
    split_eval_holdout,
)
from runtime.devices import Device
from runtime.eval import eval_only
from runtime.pipeline.base import PipelineParts
from runtime.pipeline.evaluate import EvalPipeline, build_eval
from runtime.pipeline.plans import dataset_config, role_plan
from runtime.pipeline.rl import RLPipeline, build_rl
from runtime.pipeline.sft import SFTPipeline, build_sft
from runtime.reporter import EventKind, Phase, Reporter
from runtime.roles.groups import start_roles
from runtime.roles.logs import LogRelay
from runtime.saving import CheckpointManager
from runtime.spec import RuntimeSpec
from runtime.weight_sync import weight_sync_for

transformers.utils.logging.disable_progress_bar()
log = logging.getLogger("runtime.pipeline")

Pipeline = RLPipeline | SFTPipeline  # an eval-only job's EvalPipeline is an RLPipeline with no step


def build_pipeline(
    spec: RuntimeSpec,
    reporter: Reporter,
    *,
    device: Device | None = None,
    actor_env: dict[str, str] | None = None,
) -> Pipeline:
    """Read the data, start the roles, build the job's pipeline (RL, SFT, or eval-only:
    `runtime.eval.eval_only`), and report the job as running."""
    check_paths(spec)  # a platform job opens only the paths the platform resolved (runtime.access)
    torch.manual_seed(spec.seed)
    device = device or Device.for_roles()
    tokenizer = AutoTokenizer.from_pretrained(spec.hf_checkpoint)
    formatter = PromptFormatter(tokenizer, dataset_config(spec))
    evaluating = eval_only(spec)  # no training prompt is read: only the eval sets
    items = (
        read_prompt_items(spec.prompt_data, formatter.config) if spec.prompt_data and not evaluating else []
    )
    sft_eval_items: list[PromptItem] = []
    if spec.is_sft and spec.eval_size is not None:
        items, sft_eval_items = split_eval_holdout(items, spec.eval_size, spec.seed)
    elif not spec.is_sft and not evaluating:
        items, dropped = drop_long_prompts(items, formatter, spec.rollout_max_prompt_len)
        if dropped:
            log.warning(
                "rollout_max_prompt_len=%s: %d prompt(s) longer than that dropped",
                spec.rollout_max_prompt_len,
                dropped,
            )
    total = spec.total_rollouts(len(items))
    started = time.perf_counter()
    roles = start_roles(role_plan(spec, total, device), device=device, env_vars=actor_env)
    if roles.rollout is not None and roles.rollout.elastic is not None:  # the engines the pass grants
        roles.rollout.elastic.follow = lambda: reporter.grant
        roles.rollout.elastic.report_followed = reporter.rollout_followed  # engines taken back are stopped
        roles.rollout.elastic.report_wish = reporter.rollout_wish  # and what the driver asks it for
    relay = LogRelay(roles.log_sink, reporter) if roles.log_sink is not None else None
    reporter.event(EventKind.MODEL_LOADED, f"{spec.hf_checkpoint} in {time.perf_counter() - started:.1f}s")
    checkpoints = CheckpointManager(spec, reporter, roles.train)
    parts = PipelineParts(
        spec=spec,
        reporter=reporter,
        tokenizer=tokenizer,
        roles=roles,
        total_rollouts=total,
        checkpoints=checkpoints,
        # engines in the trainer's ranks take the weights in place; engines on GPUs of their own over NCCL;
        # the rest from Ray's object store (`runtime.weight_sync.select`)
        weight_sync=weight_sync_for(roles, device, spec.values()),
        relay=relay,
    )
    try:
        pipeline: Pipeline | EvalPipeline
        if evaluating:
            pipeline = build_eval(parts, formatter)
        elif spec.is_sft:
            pipeline = build_sft(parts, formatter, items, sft_eval_items)
        else:
            pipeline = build_rl(parts, formatter, items)
    except BaseException:
        _abandon(checkpoints, relay, roles)
        raise
    reporter.set_phase(Phase.RUNNING)
    reporter.set_progress(0, total)
    return pipeline


def _abandon(checkpoints: CheckpointManager, relay: LogRelay | None, roles: Any) -> None:
    """A build that failed after the roles started: what `PipelineBase.close` would release."""
    try:
        checkpoints.collect(wait=True)
    except Exception:  # noqa: BLE001 - the build's own error is the one to raise
        log.warning("closing the pipeline", exc_info=True)
    finally:
        if relay is not None:
            relay.close()
        roles.shutdown()
