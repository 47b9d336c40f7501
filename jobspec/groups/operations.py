"""Parameter groups for operations: fault tolerance, elastic scaling, logging, router, debug, profiling."""

from __future__ import annotations

from typing import Literal

from jobspec.arguments import megatron
from jobspec.fields import ByteSize, ParamGroup, param

__all__ = [
    "FaultToleranceParams",
    "ElasticParams",
    "LoggingParams",
    "RouterParams",
    "MiscParams",
    "DebugParams",
    "ProfilingParams",
    "NetworkParams",
]


class FaultToleranceParams(ParamGroup):
    group = "fault_tolerance"
    title = "Fault tolerance"

    use_fault_tolerance: bool = param(False, "Enable fault tolerance during rollout.")
    use_health_check: bool = param(
        False,
        "Enable the global health check: the controller's HealthManager watches every service and "
        "restarts on failure.",
    )
    max_global_restart: int = param(
        3, "Maximum global restarts before training stops. Only used with --use-health-check.", ge=0
    )
    rollout_health_check_interval: float = param(30.0, "Rollout engine health check interval (s).", gt=0)
    rollout_health_check_timeout: float = param(30.0, "Rollout engine health check timeout (s).", gt=0)
    rollout_health_check_first_wait: float = param(
        0.0, "Wait before the first health check (s); raise it when using DeepGEMM.", ge=0
    )


class ElasticParams(ParamGroup):
    group = "elastic"
    title = "Elastic scaling"

    autoscaler_config: str | None = param(
        None,
        "Autoscaler YAML config; setting it enables autoscaling. Example: "
        "relax/utils/autoscaler/autoscaler.yaml.",
        path_kind="input",
    )
    scale_out_timeout: float = param(
        300.0,
        "Timeout (s) for every scale-out operation (engine start, connect, health check, weight sync).",
        gt=0,
    )
    scale_out_partial_success_policy: Literal["rollback_all", "keep_partial"] = param(
        "rollback_all",
        "When a scale-out partly succeeds: rollback_all reverts every engine; keep_partial keeps the ones "
        "that came up.",
    )
    scale_weight_sync_precheck: bool = param(
        True,
        "Run a standalone NCCL precheck before scale-out weight sync and fail closed on an incompatible "
        "transport. --no-scale-weight-sync-precheck turns it (and the fail-closed protection) off.",
        kind="negatable",
    )
    scale_in_drain_timeout: float = param(
        30.0, "Timeout (s) to drain in-flight requests before force-aborting on scale-in.", gt=0
    )
    scale_in_shutdown_timeout: float = param(
        30.0, "Timeout (s) for a graceful SGLang engine shutdown; ray.kill is used after it.", gt=0
    )


class LoggingParams(ParamGroup):
    group = "logging"
    title = "Logging and monitoring"

    use_tensorboard: bool = param(
        True, "Log to TensorBoard (on unless --no-use-tensorboard).", kind="negatable"
    )
    tb_project_name: str | None = param(
        None, "TensorBoard log directory.", path_kind="output", unset="$TENSORBOARD_DIR"
    )
    tb_experiment_name: str | None = param(None, "TensorBoard experiment name.")
    use_clearml: bool = param(False, "Log to ClearML.")
    use_metrics_service: bool = param(
        True,
        "Enable the central metrics collection and reporting service (on unless --no-use-metrics-service).",
        kind="negatable",
    )
    timeline_dump_dir: str | None = param(
        None,
        "Directory for timeline trace events (Chrome trace format); unset disables timeline tracing.",
        path_kind="output",
    )
    log_passrate: bool = param(False, "Log pass@n pass rates.")
    log_multi_turn: bool = param(False, "Log multi-turn rollout information.")
    log_correct_samples: bool = param(False, "Log correct samples (English reference only).")
    log_reward_category: str | None = param(
        None, "Log reward statistics per category, read from this key of the reward dict."
    )
    notify_urls: str | None = param(None, "Apprise notification URLs, comma-separated.")


class RouterParams(ParamGroup):
    group = "router"
    title = "Router"

    use_slime_router: bool = param(
        False, "Route with SlimeRouter (text-based) instead of SGLang's token-based router."
    )
    slime_router_middleware_paths: list[str] | None = param(
        None,
        "Middleware paths for SlimeRouter (the reference's default is an empty string: none).",
        min_length=1,
        function_path=True,
    )
    slime_router_timeout: float | None = param(None, "SlimeRouter HTTP request timeout (s).", gt=0)
    slime_router_max_connections: int | None = param(
        None, "Maximum connections of SlimeRouter's HTTP client.", ge=1
    )
    slime_router_health_check_failure_threshold: int = param(
        3, "Consecutive failures before a worker is marked unhealthy.", ge=1
    )
    slime_router_sticky: bool = param(
        False,
        "Sticky sessions: pin a routing key (X-SMG-Routing-Key header) to one worker so its requests reuse "
        "that worker's prefix/KV cache. A live pin never moves when workers are added, only when its worker "
        "leaves the healthy set. Needs --use-slime-router.",
    )
    slime_router_sticky_idle_secs: float = param(
        600.0,
        "Drop a sticky key->worker pin after this many idle seconds, so the table stays bounded. Needs "
        "--slime-router-sticky.",
        gt=0,
    )


class MiscParams(ParamGroup):
    group = "misc"
    title = "Other training parameters"

    train_env_vars: dict[str, str] = param(
        {}, "Extra environment variables for the training processes (JSON)."
    )
    train_memory_margin_bytes: ByteSize = param(
        1024**3,
        'Memory margin reserved for training allocations, in bytes (default 1 GiB; specs may write "1GB").',
        size=True,
        ge=0,
    )
    disable_weights_backuper: bool = param(False, "Disable the weights backuper to save host memory.")
    custom_model_provider_path: str | None = param(
        None, "Custom model provider function.", function_path=True
    )
    recompute_loss_function: bool = param(False, "Recompute the loss function to save GPU memory.")
    log_probs_chunk_size: int = param(
        -1, "Chunk size for computing log-probs (saves memory); -1 disables chunking.", ge=-1
    )
    allgather_cp: bool = param(
        False, "All-gather across context-parallel ranks (no description in the reference)."
    )
    model_name: str | None = param(
        None,
        "Model name used for Megatron-to-HF weight conversion.",
        unset="inferred from AutoConfig.from_pretrained(hf_checkpoint)",
    )
    only_load_weight: bool = param(False, "Reference model and actor forward load weights only.")
    rlsp_server_port: int = param(8234, "HTTP port of the RLSP server.", ge=1, le=65535)
    custom_config_path: str | None = param(
        None,
        "YAML file of extra parameters; its key/values override the parsed arguments at launch.",
        path_kind="input",
    )


class DebugParams(ParamGroup):
    group = "debug"
    title = "Debugging"

    debug_rollout_only: bool = param(False, "Run rollout only, no training.")
    debug_train_only: bool = param(False, "Run training only, no rollout.")
    load_debug_rollout_data: str | None = param(
        None, "Load rollout data saved for debugging; turns on --debug-train-only.", path_kind="input"
    )
    load_debug_rollout_data_subsample: float | None = param(
        None, "Subsample the loaded debug rollout data to speed up debugging (fraction).", gt=0, le=1
    )
    save_debug_rollout_data: str | None = param(
        None, "Save rollout data; the path may contain {rollout_id}.", path_kind="output"
    )
    save_debug_train_data: str | None = param(
        None, "Save training data; the path may contain {rollout_id}.", path_kind="output"
    )
    dump_details: str | None = param(
        None,
        "Dump every training detail for post-hoc analysis (sets the two save-debug paths under it).",
        path_kind="output",
    )
    check_weight_update_equal: bool = param(False, "Check that weight updates are equal.")
    enable_cuda_memory_check: bool = param(
        False,
        "Check memory around low-level NCCL calls: log free GPU memory before each collective and attach "
        "it to the exception on failure.",
    )


class ProfilingParams(ParamGroup):
    group = "profiling"
    title = "Profiling (training and GPU memory)"

    use_pytorch_profiler = megatron(
        help="Record CUDA kernels, CPU ops and communication of training steps with the PyTorch profiler "
        "(Megatron). Traces go to traces/<tb_experiment_name>/train_trace/."
    )
    profile_step_start = megatron(
        help="First profiled step (inclusive), counted from this launch (not an absolute rollout id; restarts "
        "at 0 when resuming) (Megatron).",
        ge=0,
    )
    profile_step_end = megatron(
        help="Last profiled step (inclusive), counted like --profile-step-start; start=10, end=12 captures "
        "steps 10, 11 and 12 (Megatron).",
        ge=0,
    )
    profile_target: list[Literal["train_overall", "train_actor", "train_log_probs"]] = param(
        ["train_overall"], "What to profile.", min_length=1
    )
    profile_with_stack: bool = param(False, "Record call stacks in the profiler trace.")
    profile_with_memory: bool = param(False, "Record memory in the profiler trace.")
    profile_with_flops: bool = param(False, "Estimate FLOPs in the profiler trace.")
    record_memory_history = megatron(
        help="Record CUDA allocation history (stacks and tensors of every alloc/free) and dump a snapshot on "
        "OOM (Megatron)."
    )
    memory_snapshot_path = megatron(help="File name of the memory snapshot (Megatron).")
    memory_snapshot_dir: str | None = param(
        None,
        "Directory for memory snapshots.",
        path_kind="output",
        unset="traces/<tb_experiment_name>/memory_snapshot",
    )
    memory_snapshot_num_steps: int | None = param(
        None, "Dump a memory snapshot after this step (0-based: 3 dumps after the second step).", ge=0
    )
    memory_recorder: Literal["torch", "memray"] = param(
        "torch", "Memory recorder backend: torch (built in) or memray (pip install memray)."
    )


class NetworkParams(ParamGroup):
    group = "network"
    title = "Network"

    http_proxy: str | None = param(None, "HTTP proxy address.")
    use_distributed_post: bool = param(False, "Send POST requests in a distributed way.")
