"""How the job runs, settled first because every later rule reads it: the deprecated --loss-type alias
(an input rule, before type checks), SFT or RL, hybrid (fully async on colocated GPUs), the debug modes
and agentic rollout."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, cli_flags, rule
from jobspec.spec import FIELDS

# =============================================================================================
# Input stage: deprecated values, before type checking


@rule(
    "rule.loss_type_sft_loss",
    "loss-type",
    summary="--loss-type sft_loss (or sft-loss) is a deprecated alias: normalized to sft with a warning.",
)
def loss_type_sft_loss(ctx: RuleContext) -> None:
    value = ctx.values.get("loss_type")
    aliases = FIELDS["loss_type"].value_aliases
    if isinstance(value, str) and value in aliases:
        ctx.derive("loss_type", aliases[value])
        ctx.warn(
            f"--loss-type {value} is deprecated; it is read as --loss-type {aliases[value]}",
            f"write --loss-type {aliases[value]}",
        )


# =============================================================================================
# Mode resolution


@rule(
    "rule.sft_disables_rl_terms",
    "loss-type",
    "disable-compute-advantages-and-returns",
    "use-kl-loss",
    "kl-coef",
    "kl-loss-coef",
    "use-opd",
    "disable-rollout-global-dataset",
    summary="--loss-type sft turns off advantages, KL terms, OPD and the RL global dataset (derived; a warning "
    "names any that were set).",
)
def sft_disables_rl_terms(ctx: RuleContext) -> None:
    if not ctx.is_sft:
        return
    dropped = [n for n in ("use_kl_loss", "kl_coef", "kl_loss_coef", "use_opd") if ctx.non_default(n)]
    if dropped:
        ctx.warn(
            f"--loss-type sft ignores {cli_flags(*dropped)}: SFT trains without KL terms or distillation",
            f"remove {cli_flags(*dropped)}",
        )
    for name, value in (
        ("disable_compute_advantages_and_returns", True),
        ("use_kl_loss", False),
        ("kl_coef", 0.0),
        ("kl_loss_coef", 0.0),
        ("use_opd", False),
    ):
        if ctx.values[name] != value:
            ctx.derive(name, value)
    # SFT owns --prompt-data; Relax turns the RL global dataset off (recorded even when given: it is Relax's).
    ctx.derive("rollout_global_dataset", False)


@rule(
    "rule.fully_async_colocate_is_hybrid",
    "fully-async",
    "colocate",
    "hybrid",
    summary="--fully-async with --colocate means hybrid mode, and --hybrid implies both (derived).",
    deviation="Relax main refuses --fully-async with --colocate and asks for --hybrid; the platform reads the "
    "pair as --hybrid (with a warning), and the resolved argv carries --hybrid, which Relax accepts.",
)
def fully_async_colocate_is_hybrid(ctx: RuleContext) -> None:
    if ctx.fully_async and ctx.colocate and not ctx.hybrid:
        ctx.derive("hybrid", True)
        ctx.warn(
            "--fully-async with --colocate runs in hybrid mode (rollout on its own GPUs, actor roles "
            "sharing the actor GPUs)",
            "write --hybrid: Relax's launcher refuses --fully-async together with --colocate without it",
        )
    if ctx.hybrid:
        ctx.turn_on("fully_async", "colocate")


@rule(
    "rule.load_debug_rollout_data_implies_debug_train_only",
    "load-debug-rollout-data",
    "debug-train-only",
    summary="--load-debug-rollout-data turns on --debug-train-only (derived).",
)
def load_debug_rollout_data_implies_debug_train_only(ctx: RuleContext) -> None:
    if ctx.load_debug_rollout_data is not None:
        ctx.turn_on("debug_train_only")


@rule(
    "rule.debug_modes_exclusive",
    "debug-rollout-only",
    "debug-train-only",
    summary="--debug-rollout-only and --debug-train-only cannot both be set.",
    deviation="Relax checks this before it derives --debug-train-only from --load-debug-rollout-data, so "
    "it lets --debug-rollout-only --load-debug-rollout-data through, a job that neither generates nor "
    "trains; the platform refuses that pair too.",
)
def debug_modes_exclusive(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only and ctx.debug_train_only:
        why = (
            " (--load-debug-rollout-data turns on --debug-train-only)" if ctx.load_debug_rollout_data else ""
        )
        ctx.error(f"--debug-rollout-only and --debug-train-only are both set{why}", "keep only one of them")


@rule(
    "rule.debug_train_only_needs_rollout_data",
    "debug-train-only",
    "load-debug-rollout-data",
    "loss-type",
    summary="RL with --debug-train-only trains on saved rollouts: it needs --load-debug-rollout-data.",
    deviation="Relax's start-up checks accept RL --debug-train-only without --load-debug-rollout-data, but "
    "--debug-train-only starts no SGLang engines, so such a job has no rollouts to train on and fails at its "
    "first step. The platform refuses it at submission. (SFT reads --prompt-data itself and is exempt.)",
)
def debug_train_only_needs_rollout_data(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.debug_train_only and ctx.load_debug_rollout_data is None:
        ctx.error(
            "--debug-train-only starts no rollout engines, and an RL job without them trains on saved "
            "rollouts, but --load-debug-rollout-data is not set",
            "set --load-debug-rollout-data PATH (rollouts saved by --save-debug-rollout-data), or remove "
            "--debug-train-only",
        )


@rule(
    "rule.debug_rollout_only_topology",
    "debug-rollout-only",
    "colocate",
    "offload-train",
    "offload-rollout",
    "train-memory-margin-bytes",
    summary="--debug-rollout-only turns off colocation, offloading and the training memory margin (derived).",
)
def debug_rollout_only_topology(ctx: RuleContext) -> None:
    if not ctx.debug_rollout_only:
        return
    changed = []
    for name, value in (
        ("colocate", False),
        ("hybrid", False),
        ("offload_train", False),
        ("offload_rollout", False),
        ("train_memory_margin_bytes", 0),
    ):
        if ctx.values[name] != value:
            if ctx.given(name):
                changed.append(name)
            ctx.derive(name, value)
    if changed:
        ctx.warn(
            f"--debug-rollout-only overrides {cli_flags(*changed)} (no training runs)",
            f"remove {cli_flags(*changed)}",
        )


AGENTIC_ROLLOUT_FUNCTION = "relax.agentic.rollout.generate_rollout"


@rule(
    "rule.agentic_rollout",
    "use-agentic-rollout",
    "agent-command",
    "agent-cwd",
    "agent-timeout",
    "agent-env",
    summary="--use-agentic-rollout sets the rollout and eval functions to Relax's agentic rollout and turns "
    "--apply-chat-template off (derived); it needs --agent-command and --agent-cwd, a positive "
    "--agent-timeout and KEY=VALUE --agent-env entries (no RELAX_ keys).",
)
def agentic_rollout(ctx: RuleContext) -> None:
    if not ctx.use_agentic_rollout:
        return
    ctx.derive("rollout_function_path", AGENTIC_ROLLOUT_FUNCTION)
    ctx.derive("eval_function_path", AGENTIC_ROLLOUT_FUNCTION)
    ctx.derive("apply_chat_template", False)
    for name in ("agent_command", "agent_cwd"):
        value = ctx.values[name]
        if not isinstance(value, str) or not value.strip():
            ctx.error(
                f"--use-agentic-rollout needs --{FIELDS[name].flag}",
                f"set --{FIELDS[name].flag}",
                fields=(FIELDS[name].flag, "use-agentic-rollout"),
            )
    if ctx.agent_timeout is not None and ctx.agent_timeout <= 0:
        ctx.error(f"--agent-timeout {ctx.agent_timeout} must be > 0", "use a positive timeout in seconds")
    for item in ctx.agent_env or []:
        key = str(item).split("=", 1)[0].strip()
        if "=" not in str(item) or not key:
            ctx.error(
                f"--agent-env entry {item!r} is not KEY=VALUE", "write KEY=VALUE", fields=("agent-env",)
            )
        elif key.startswith("RELAX_"):
            ctx.error(
                f"--agent-env may not set {key!r}: RELAX_ variables are reserved",
                "rename the variable",
                fields=("agent-env",),
            )
    for name, low in (("agentic_prepare_pool_size", 0), ("agentic_eval_prepare_pool_size", 1)):
        value = ctx.values[name]
        if value is not None and value < low:
            ctx.error(
                f"--{FIELDS[name].flag} {value} must be >= {low}",
                f"use a value >= {low}",
                fields=(FIELDS[name].flag,),
            )
