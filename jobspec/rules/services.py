"""Data and the services around rollout: prompt data and its keys, prefetching, remote reward models,
GenRM, external engines, the slime router, restarts, debug dumps, the custom config."""

from __future__ import annotations

from urllib.parse import urlsplit

from jobspec.rules.context import RuleContext, cli_flags, options_need, requires, rule, value_needs
from jobspec.spec import FIELDS


@rule(
    "rule.prompt_data_required",
    "prompt-data",
    "data-source-path",
    "load-debug-rollout-data",
    summary="RL training reads prompts from --prompt-data (unless a custom data source / rollout function, "
    "--debug-train-only or --load-debug-rollout-data supplies samples).",
    deviation="Relax's start-up checks do not require --prompt-data for RL; the default data source fails "
    "when it opens it. The platform refuses it at submission.",
)
def prompt_data_required(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.prompt_data is not None or ctx.debug_train_only:
        return
    if ctx.non_default("data_source_path") or ctx.non_default("rollout_function_path"):
        return
    ctx.error(
        "--prompt-data is not set and the default data source reads prompts from it",
        "set --prompt-data PATH (or a custom --data-source-path)",
    )


@rule(
    "rule.conversation_key_map_needs_no_label_key",
    "conversation-key-map",
    "label-key",
    summary="--conversation-key-map only applies when --label-key is not set (warning).",
)
def conversation_key_map_needs_no_label_key(ctx: RuleContext) -> None:
    if ctx.conversation_key_map is not None and ctx.label_key is not None:
        ctx.warn(
            "--conversation-key-map is ignored because --label-key is set",
            "remove --label-key when --input-key holds whole message lists",
        )


prefetch_needs_streaming_dataset = options_need(
    "rule.prefetch_needs_streaming_dataset",
    "use-streaming-dataset",
    "prefetch_chunk_size",
    "prefetch_max_cached",
    "prefetch_num_workers",
    summary="--prefetch-* options only apply with --use-streaming-dataset (warning).",
    why="only apply with --use-streaming-dataset (multimodal data)",
    hint="add --use-streaming-dataset or remove them",
    rule_fields=True,
)


@rule(
    "rule.rm_type_unset",
    "rm-type",
    "custom-rm-path",
    "rm-type-infer",
    "rm-type-fallback",
    summary="An RL job that generates scores each sample by its metadata rm_type when none of --rm-type, "
    "--custom-rm-path, --rm-type-infer and --rm-type-fallback is set (warning).",
)
def rm_type_unset(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.debug_train_only:  # SFT scores nothing; loaded rollouts are not scored again
        return
    if ctx.rm_type or ctx.custom_rm_path or ctx.rm_type_infer or ctx.rm_type_fallback:
        return
    ctx.warn(
        "no reward is configured (--rm-type, --custom-rm-path, --rm-type-infer, --rm-type-fallback): every "
        f"sample must name its reward in metadata.rm_type (the --metadata-key field, {ctx.metadata_key!r}), "
        "or the job fails at its first reward",
        "set --rm-type (e.g. math), or --rm-type-fallback zero to score unlabelled samples 0",
    )


remote_rm_needs_rm_url = value_needs(
    "rule.remote_rm_needs_rm_url",
    "rm-type",
    "remote_rm",
    "rm-url",
    summary="--rm-type remote_rm needs --rm-url.",
    hint="set --rm-url http://host:port/path",
    deviation="Relax's start-up checks do not look for --rm-url; the job would fail at its first reward. "
    "The platform refuses it at submission.",
)


@rule(
    "rule.genrm_sampling_config_keys",
    "genrm-sampling-config",
    summary="--genrm-sampling-config keys Relax reads: temperature, top_p, top_k, max_response_len and "
    "chat_template_kwargs; other keys are ignored (warning).",
)
def genrm_sampling_config_keys(ctx: RuleContext) -> None:
    cfg = ctx.genrm_sampling_config
    if not isinstance(cfg, dict):
        return
    unknown = sorted(k for k in cfg if k not in GENRM_SAMPLING_KEYS)
    if unknown:
        ctx.warn(
            f"--genrm-sampling-config key(s) {', '.join(map(str, unknown))} are not read by Relax's GenRM and "
            "have no effect",
            f"use {', '.join(GENRM_SAMPLING_KEYS)}",
        )


#: The keys Relax's GenRM service reads from --genrm-sampling-config (relax/components/genrm.py, main).
GENRM_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_response_len", "chat_template_kwargs")


@rule(
    "rule.genrm_options_need_model",
    "genrm-model-path",
    "genrm-engine-config",
    "genrm-sampling-config",
    "genrm-num-gpus",
    summary="GenRM options need --genrm-model-path (warning); with it, the two configs default to {} (derived).",
)
def genrm_options_need_model(ctx: RuleContext) -> None:
    if ctx.genrm_model_path is None:
        used = [
            n
            for n in (
                "genrm_engine_config",
                "genrm_sampling_config",
                "genrm_num_gpus",
                "genrm_num_gpus_per_engine",
            )
            if ctx.non_default(n)
        ]
        if used:
            ctx.warn(
                f"{cli_flags(*used)} have no effect without --genrm-model-path",
                "set --genrm-model-path or remove them",
            )
        return
    for name in ("genrm_engine_config", "genrm_sampling_config"):
        if ctx.values[name] is None:
            ctx.derive(name, {})


@rule(
    "rule.rollout_external_needs_addrs",
    "rollout-external",
    "rollout-external-engine-addrs",
    summary="--rollout-external needs --rollout-external-engine-addrs (addresses alone are a warning).",
    deviation="Relax's start-up checks do not look for the addresses; the job would fail when it connects "
    "to the external engines. The platform refuses it at submission.",
)
def rollout_external_needs_addrs(ctx: RuleContext) -> None:
    if ctx.rollout_external and not ctx.rollout_external_engine_addrs:
        ctx.error("--rollout-external needs --rollout-external-engine-addrs", "list the engines' host:port")
    elif ctx.rollout_external_engine_addrs and not ctx.rollout_external:
        ctx.warn(
            "--rollout-external-engine-addrs is ignored without --rollout-external", "add --rollout-external"
        )


sticky_routing_needs_slime_router = requires(
    "rule.sticky_routing_needs_slime_router",
    "slime-router-sticky",
    "use-slime-router",
    summary="--slime-router-sticky has no effect without --use-slime-router (warning, as Relax's help says).",
    message="--slime-router-sticky has no effect without --use-slime-router",
    warn=True,
)


@rule(
    "rule.slime_router_options",
    "use-slime-router",
    "slime-router-sticky-idle-secs",
    "slime-router-timeout",
    summary="SlimeRouter options need --use-slime-router, and the sticky idle timeout needs sticky routing (warning).",
)
def slime_router_options(ctx: RuleContext) -> None:
    ctx.warn_unless(
        "use-slime-router",
        "slime_router_middleware_paths",
        "slime_router_timeout",
        "slime_router_max_connections",
        "slime_router_health_check_failure_threshold",
        hint="add --use-slime-router or remove them",
    )
    if ctx.non_default("slime_router_sticky_idle_secs") and not ctx.slime_router_sticky:
        ctx.warn(
            "--slime-router-sticky-idle-secs only applies with --slime-router-sticky",
            "add --slime-router-sticky or remove it",
            fields=("slime-router-sticky-idle-secs", "slime-router-sticky"),
        )


@rule(
    "rule.max_global_restart_needs_health_check",
    "max-global-restart",
    "use-health-check",
    "use-fault-tolerance",
    summary="--max-global-restart only applies with --use-health-check or --use-fault-tolerance (warning).",
)
def max_global_restart_needs_health_check(ctx: RuleContext) -> None:
    # On the platform, --use-fault-tolerance makes it the number of times a lost driver is resumed from the
    # job's checkpoint (scheduler/recovery.py); --use-health-check, the number of rollout engines the driver
    # replaces when hung or dead (runtime/roles/engine_health.py).
    if ctx.non_default("max_global_restart") and not (ctx.use_health_check or ctx.use_fault_tolerance):
        ctx.warn(
            "--max-global-restart only applies with --use-health-check or --use-fault-tolerance",
            "add --use-health-check (hung or dead rollout engines are replaced at most this many times) or "
            "--use-fault-tolerance (the platform resumes a lost driver at most this many times)",
        )


@rule(
    "rule.dump_details_sets_debug_paths",
    "dump-details",
    "save-debug-rollout-data",
    "save-debug-train-data",
    summary="--dump-details DIR sets --save-debug-rollout-data and --save-debug-train-data under DIR (derived).",
)
def dump_details_sets_debug_paths(ctx: RuleContext) -> None:
    base = ctx.dump_details
    if base is None:
        return
    targets = {
        "save_debug_rollout_data": f"{base}/rollout_data/{{rollout_id}}.pt",
        "save_debug_train_data": f"{base}/train_data/{{rollout_id}}_{{rank}}.pt",
    }
    for name, value in targets.items():
        if ctx.values[name] != value:
            if ctx.values[name] is not None:
                ctx.warn(
                    f"--dump-details overrides --{FIELDS[name].flag} with {value!r}",
                    f"remove --{FIELDS[name].flag}",
                    fields=("dump-details", FIELDS[name].flag),
                )
            ctx.derive(name, value)


@rule(
    "rule.custom_config_applied_at_launch",
    "custom-config-path",
    summary="--custom-config-path overrides parameters at launch from a file this validator cannot read (warning).",
)
def custom_config_applied_at_launch(ctx: RuleContext) -> None:
    if ctx.custom_config_path is not None:
        ctx.warn(
            f"--custom-config-path {ctx.custom_config_path!r} overrides parameters when the job starts; those "
            "values are not validated here",
            "put the parameters in the spec itself to have them validated",
        )


MAX_NOTIFY_URLS = 10  # scheduler/services/webhooks.py sends to at most these


@rule(
    "rule.notify_urls_http",
    "notify-urls",
    summary="--notify-urls takes at most 10 http:// and https:// URLs (no user:password@): each gets a POST of "
    "every status change of the job, signed as Standard Webhooks specifies with the job's own secret.",
    deviation="Relax hands --notify-urls to Apprise, which takes its own URL schemes (mailto://, slack://, tgram://"
    "...) and notifies when the job ends. The platform sends the job's status changes (job.queued ... "
    "job.succeeded/failed/cancelled) through its webhook delivery (docs/reference/webhooks.md), which POSTs to "
    "http(s) URLs only; any other scheme is refused at submission.",
)
def notify_urls_http(ctx: RuleContext) -> None:
    if not isinstance(ctx.notify_urls, str):
        return
    urls = [u.strip() for u in ctx.notify_urls.split(",") if u.strip()]
    if len(urls) > MAX_NOTIFY_URLS:
        ctx.error(
            f"--notify-urls has {len(urls)} URLs; the platform notifies at most {MAX_NOTIFY_URLS}",
            "keep at most 10, or register a team webhook that fans out: relaxctl webhooks create URL",
        )
        return
    for url in urls:
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            parts, host = None, None
        scheme = parts.scheme if parts is not None else ""
        if scheme not in ("http", "https") or not host:
            shown = f"{scheme}://…" if scheme else repr(url[:40])
            ctx.error(
                f"--notify-urls has {shown}: the platform notifies only http:// and https:// URLs (Apprise "
                "schemes are not supported)",
                "give an http(s) URL that accepts a POST (a chat tool's incoming-webhook URL works), or register "
                "a team webhook: relaxctl webhooks create URL (docs/reference/webhooks.md)",
            )
            return
        if parts is not None and (parts.username is not None or parts.password is not None):
            ctx.error(
                f"--notify-urls has a URL of {host} with user:password@ in it, which the platform does not send",
                "put a token in the path or query instead (the message is signed: GET /v1/webhooks/jobs/{id} "
                "shows the job's secret)",
            )
            return
