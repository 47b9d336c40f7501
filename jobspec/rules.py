"""Every cross-field rule and derived default of the Relax configuration, in one ordered registry.

A rule has a stable code (``rule.<name>``), the flags it involves, a one-line summary, and a
function that reads the field values and reports through the context: `ctx.error` / `ctx.warn`
for problems, `ctx.derive` to fill a derived default (recorded in `NormalizedSpec.derived`).
Rules run in registry order, which follows Relax's own start-up checks (`slime_validate_args` in
relax/utils/arguments.py) where the reference is silent about order: derivations come before the
checks that read their result.

To add a rule: write a function below with `@rule(code, flags..., summary=...)`, place it after the
rules whose derived values it reads, and add a broken and a satisfied case to
tests/unit/jobspec/test_rules.py (a test fails for any registered rule without both).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobspec.arguments import MEGATRON, RELAX_MAIN
from jobspec.demand import (
    KNOWN_ROLES,
    actor_gpus,
    critic_gpus,
    genrm_gpus,
    legacy_actor_note,
    managed_teacher,
    model_parallel_size,
    resource_roles,
    rollout_gpus,
)
from jobspec.generated.arguments import RELAX_MEGATRON_DEFAULTS
from jobspec.issues import SpecIssue
from jobspec.spec import FIELDS

__all__ = [
    "Rule",
    "RuleContext",
    "RULES",
    "INPUT_RULES",
    "PLATFORM_DEVIATIONS",
    "RETIRED_RULES",
    "deviations",
    "run_input_rules",
    "run_rules",
    "rule",
]


@dataclass(frozen=True)
class Rule:
    code: str
    fields: tuple[str, ...]  # Relax flags (hyphenated)
    summary: str
    fn: Callable[[RuleContext], None]
    # Why this rule deliberately differs from Relax's code (None: it does what Relax's code does).
    deviation: str | None = None


class RuleContext:
    """What a rule sees: field values (by name), which ones the user gave, and the report sinks."""

    def __init__(self, values: dict[str, Any], explicit: set[str], max_gpus_per_node: int | None = None):
        self.values = values
        self.explicit = explicit
        self.max_gpus_per_node = max_gpus_per_node
        self.issues: list[SpecIssue] = []
        self.derived: dict[str, Any] = {}
        self._rule: Rule | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    # -- reporting --------------------------------------------------------------------------
    def _issue(
        self, severity: str, message: str, hint: str, fields: tuple[str, ...] | None, code: str | None
    ):
        assert self._rule is not None
        flags = list(fields or self._rule.fields)
        self.issues.append(
            SpecIssue(
                code=code or self._rule.code,
                field=flags[0] if flags else None,
                message=message,
                hint=hint,
                severity=severity,  # type: ignore[arg-type]
                fields=flags,
            )
        )

    def error(
        self, message: str, hint: str, *, fields: tuple[str, ...] | None = None, code: str | None = None
    ):
        self._issue("error", message, hint, fields, code)

    def warn(
        self, message: str, hint: str, *, fields: tuple[str, ...] | None = None, code: str | None = None
    ):
        self._issue("warning", message, hint, fields, code)

    def derive(self, name: str, value: Any) -> None:
        """Set a derived default and record it."""
        self.values[name] = value
        self.derived[name] = value

    def given(self, name: str) -> bool:
        """True when the user set this field (even to its default value)."""
        return name in self.explicit

    def non_default(self, name: str) -> bool:
        return self.values[name] != FIELDS[name].default

    @property
    def is_sft(self) -> bool:
        return self.values["loss_type"] == "sft"

    @property
    def is_ppo(self) -> bool:
        return self.values["advantage_estimator"] == "ppo"

    @property
    def megatron(self) -> bool:
        """The megatron backend: Relax's `_set_default_megatron_args` applies (relax/backends/megatron)."""
        return self.values["train_backend"] == "megatron"

    @property
    def megatron_validates(self) -> bool:
        """Megatron's `validate_args` runs: the megatron backend, unless --debug-rollout-only (Relax skips it)."""
        return self.megatron and not self.values["debug_rollout_only"]


RULES: list[Rule] = []
INPUT_RULES: list[Rule] = []


def rule(
    code: str, *flags: str, summary: str, stage: str = "spec", deviation: str | None = None
) -> Callable[[Callable], Callable]:
    """Register a rule (in definition order). stage "input" rules see raw values before type checks.

    deviation: why the rule deliberately differs from Relax's code (it refuses what Relax's code accepts,
    or accepts what it refuses); every deviation is listed in the generated reference (`deviations()`).
    """

    def decorate(fn: Callable[[RuleContext], None]) -> Callable[[RuleContext], None]:
        registry = INPUT_RULES if stage == "input" else RULES
        if any(r.code == code for r in RULES + INPUT_RULES):
            raise ValueError(f"duplicate rule code {code}")
        if deviation is not None and not deviation.strip():
            raise ValueError(f"rule {code}: a deviation needs its reason")
        registry.append(Rule(code=code, fields=flags, summary=summary, fn=fn, deviation=deviation))
        return fn

    return decorate


#: Deviations from Relax's code that are not one rule's check: (code, flags, reason).
PLATFORM_DEVIATIONS: list[tuple[str, tuple[str, ...], str]] = [
    (
        "rule.torch_backend_is_platform_extension",
        ("train-backend",),
        "--train-backend torch is a Relax Platform backend: Relax's own parser accepts megatron only. It is "
        "the backend this platform runs; the resolved argv keeps --train-backend torch, so it runs here, not "
        "under Relax's launcher.",
    ),
]

#: Codes that are no longer reported, and why (codes are an API: a retired code is never reused).
RETIRED_RULES: dict[str, str] = {
    "rule.ppo_needs_rollout_logprobs": "not a rule of Relax main, whose PPO scripts run without "
    "--use-rollout-logprobs. Nor a limit of this platform: both backends recompute the old-policy log-probs "
    "with the trainer before every update (the ratio's pi_old unless --use-rollout-logprobs picks the "
    "engine's), so PPO runs with or without the flag.",
    "rule.torch_backend_is_platform_extension": "the note is listed among the deviations "
    "(PLATFORM_DEVIATIONS) instead of being a warning on every job that selects the torch backend.",
    "rule.reinforce_plus_plus_baseline_without_kl_coef": "not a limit any more: reinforce_plus_plus_baseline "
    "applies --kl-coef as Relax does (A_t = reward - group mean - kl_coef * KL_t, then whitened), so the "
    "setting is accepted (issue 17).",
}


def deviations() -> list[tuple[str, tuple[str, ...], str]]:
    """Every deliberate deviation from Relax's code: (code, flags, reason), rules first in registry order.

    `python -m jobspec.docs` lists them in docs/reference/parameters.md.
    """
    out = [(r.code, r.fields, r.deviation) for r in INPUT_RULES + RULES if r.deviation]
    return out + list(PLATFORM_DEVIATIONS)  # type: ignore[return-value]


def _run(registry: list[Rule], ctx: RuleContext) -> RuleContext:
    for r in registry:
        ctx._rule = r
        r.fn(ctx)
    ctx._rule = None
    return ctx


def run_input_rules(values: dict[str, Any], explicit: set[str]) -> RuleContext:
    return _run(INPUT_RULES, RuleContext(values, explicit))


def run_rules(
    values: dict[str, Any], explicit: set[str], max_gpus_per_node: int | None = None
) -> RuleContext:
    return _run(RULES, RuleContext(values, explicit, max_gpus_per_node))


def _flags(*names: str) -> str:
    return ", ".join(f"--{FIELDS[n].flag}" for n in names)


# =============================================================================================
# Input stage: deprecated values, before type checking


@rule(
    "rule.loss_type_sft_loss",
    "loss-type",
    summary="--loss-type sft_loss (or sft-loss) is a deprecated alias: normalized to sft with a warning.",
    stage="input",
)
def _loss_type_alias(ctx: RuleContext) -> None:
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
def _sft_disables_rl(ctx: RuleContext) -> None:
    if not ctx.is_sft:
        return
    dropped = [n for n in ("use_kl_loss", "kl_coef", "kl_loss_coef", "use_opd") if ctx.non_default(n)]
    if dropped:
        ctx.warn(
            f"--loss-type sft ignores {_flags(*dropped)}: SFT trains without KL terms or distillation",
            f"remove {_flags(*dropped)}",
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
def _hybrid(ctx: RuleContext) -> None:
    if ctx.fully_async and ctx.colocate and not ctx.hybrid:
        ctx.derive("hybrid", True)
        ctx.warn(
            "--fully-async with --colocate runs in hybrid mode (rollout on its own GPUs, actor roles "
            "sharing the actor GPUs)",
            "write --hybrid: Relax's launcher refuses --fully-async together with --colocate without it",
        )
    if ctx.hybrid:
        for name in ("fully_async", "colocate"):
            if not ctx.values[name]:
                ctx.derive(name, True)


@rule(
    "rule.load_debug_rollout_data_implies_debug_train_only",
    "load-debug-rollout-data",
    "debug-train-only",
    summary="--load-debug-rollout-data turns on --debug-train-only (derived).",
)
def _load_debug(ctx: RuleContext) -> None:
    if ctx.load_debug_rollout_data is not None and not ctx.debug_train_only:
        ctx.derive("debug_train_only", True)


@rule(
    "rule.debug_modes_exclusive",
    "debug-rollout-only",
    "debug-train-only",
    summary="--debug-rollout-only and --debug-train-only cannot both be set.",
    deviation="Relax checks this before it derives --debug-train-only from --load-debug-rollout-data, so "
    "it lets --debug-rollout-only --load-debug-rollout-data through, a job that neither generates nor "
    "trains; the platform refuses that pair too.",
)
def _debug_exclusive(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only and ctx.debug_train_only:
        why = (
            " (--load-debug-rollout-data turns on --debug-train-only)" if ctx.load_debug_rollout_data else ""
        )
        ctx.error(f"--debug-rollout-only and --debug-train-only are both set{why}", "keep only one of them")


@rule(
    "rule.debug_rollout_only_topology",
    "debug-rollout-only",
    "colocate",
    "offload-train",
    "offload-rollout",
    "train-memory-margin-bytes",
    summary="--debug-rollout-only turns off colocation, offloading and the training memory margin (derived).",
)
def _debug_rollout_only(ctx: RuleContext) -> None:
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
            f"--debug-rollout-only overrides {_flags(*changed)} (no training runs)",
            f"remove {_flags(*changed)}",
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
def _agentic(ctx: RuleContext) -> None:
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


# =============================================================================================
# Relax's legacy per-role GPU flags (before every rule that reads --resource)

#: The flags Relax sizes roles with when --resource is absent (slime's layout flags).
LEGACY_LAYOUT_FLAGS = ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus")


@rule(
    "rule.legacy_layout_resource",
    "actor-num-nodes",
    "actor-num-gpus-per-node",
    "rollout-num-gpus",
    "resource",
    summary="Without --resource, Relax's legacy --actor-num-nodes x --actor-num-gpus-per-node (and "
    "--rollout-num-gpus, which --colocate overrides to the actor's GPUs) size the roles: the platform derives "
    "the equivalent --resource from them, so placement and the demand read one layout.",
)
def _legacy_layout_resource(ctx: RuleContext) -> None:
    if ctx.resource is not None or not any(ctx.given(name) for name in LEGACY_LAYOUT_FLAGS):
        return
    nodes = int(ctx.actor_num_nodes if ctx.actor_num_nodes is not None else 1)
    total = actor_gpus(ctx.values)
    resource: dict[str, list[int]] = {"actor": [nodes, total]}
    if ctx.colocate:
        resource["rollout"] = [1, total]  # Relax: colocated engines span the actor's GPUs
    elif ctx.rollout_num_gpus is not None:
        resource["rollout"] = [1, int(ctx.rollout_num_gpus)]
    ctx.derive("resource", resource)


# =============================================================================================
# PPO (before KL and offload rules, which read what it changes)


@rule(
    "rule.ppo_topology",
    "advantage-estimator",
    "colocate",
    "fully-async",
    "resource",
    summary="PPO runs in synchronous colocate mode with 'critic' and 'advantages' entries in --resource.",
    deviation="Relax main (039ce87) refuses --advantage-estimator ppo outright and eb15c45's code does not "
    "check its topology; the platform runs the reference's PPO (synchronous, colocated, with a critic role) "
    "on its torch backend, in that topology only.",
)
def _ppo_topology(ctx: RuleContext) -> None:
    if not ctx.is_ppo or ctx.is_sft:
        return
    if ctx.fully_async:
        ctx.error(
            "--advantage-estimator ppo supports only the synchronous pipeline, but --fully-async is set",
            "remove --fully-async (and --hybrid) for PPO",
            fields=("advantage-estimator", "fully-async"),
        )
    if not ctx.colocate:
        ctx.error(
            "--advantage-estimator ppo currently runs only in colocate mode, but --colocate is not set",
            "add --colocate",
            fields=("advantage-estimator", "colocate"),
        )
    roles = resource_roles(ctx.values)
    missing = [r for r in ("critic", "advantages") if r not in roles]
    if missing:
        ctx.error(
            f"--advantage-estimator ppo needs {', '.join(repr(m) for m in missing)} in --resource "
            f"(got roles: {', '.join(sorted(roles)) or 'none'})",
            'e.g. --resource \'{"actor": [1, 4], "critic": [1, 4], "rollout": [1, 8], "advantages": [1, 0]}\'',
            fields=("advantage-estimator", "resource"),
        )


@rule(
    "rule.ppo_disables_kl",
    "advantage-estimator",
    "kl-coef",
    "use-kl-loss",
    summary="Synchronous PPO resets a non-zero --kl-coef to 0 and turns --use-kl-loss off (derived, warned).",
    deviation="Relax's code does not reset them (main refuses PPO); the reference's synchronous PPO trains "
    "without KL terms, and the resolved argv says so.",
)
def _ppo_kl(ctx: RuleContext) -> None:
    if not ctx.is_ppo or ctx.fully_async:
        return
    if ctx.kl_coef != 0:
        ctx.warn(
            f"synchronous PPO resets --kl-coef {ctx.kl_coef} to 0",
            "remove --kl-coef",
            fields=("advantage-estimator", "kl-coef"),
        )
        ctx.derive("kl_coef", 0.0)
    if ctx.use_kl_loss:
        ctx.warn(
            "synchronous PPO turns --use-kl-loss off",
            "remove --use-kl-loss",
            fields=("advantage-estimator", "use-kl-loss"),
        )
        ctx.derive("use_kl_loss", False)


@rule(
    "rule.critic_defaults",
    "critic-load",
    "load",
    "critic-lr",
    "lr",
    summary="With a critic (PPO), --critic-load defaults to --load and --critic-lr to --lr (derived).",
)
def _critic_defaults(ctx: RuleContext) -> None:
    if not ctx.is_ppo:
        return
    if ctx.critic_load is None and ctx.load is not None:
        ctx.derive("critic_load", ctx.load)
    if ctx.critic_lr is None:
        ctx.derive("critic_lr", ctx.lr)


@rule(
    "rule.critic_options_need_ppo",
    "num-critic-only-steps",
    "critic-train-only",
    "advantage-estimator",
    summary="--num-critic-only-steps > 0 and --critic-train-only only apply with a critic (--advantage-estimator "
    "ppo); without one Relax ignores them (warning).",
)
def _critic_need_ppo(ctx: RuleContext) -> None:
    if ctx.is_ppo:
        return
    used = [n for n in ("num_critic_only_steps", "critic_train_only") if ctx.non_default(n)]
    if used:
        ctx.warn(
            f"{_flags(*used)} train a critic, but --advantage-estimator {ctx.advantage_estimator} has none: "
            "Relax ignores them",
            "use --advantage-estimator ppo or remove them",
            fields=(*(FIELDS[u].flag for u in used), "advantage-estimator"),
        )


# =============================================================================================
# Offloading


@rule(
    "rule.offload_implies_both",
    "offload",
    "offload-train",
    "offload-rollout",
    summary="--offload means --offload-train and --offload-rollout (derived); it overrides an explicit "
    "--no-offload-* (warning), as Relax does.",
)
def _offload(ctx: RuleContext) -> None:
    if not ctx.offload or ctx.debug_rollout_only:
        return  # --debug-rollout-only turns both off after --offload (rule.debug_rollout_only_topology)
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is False:
            ctx.warn(
                f"--offload turns on --{FIELDS[name].flag}, overriding --no-{FIELDS[name].flag}",
                f"remove --offload or --no-{FIELDS[name].flag}",
                fields=("offload", FIELDS[name].flag),
            )
        if ctx.values[name] is not True:
            ctx.derive(name, True)


@rule(
    "rule.colocate_implies_offload",
    "colocate",
    "offload-train",
    "offload-rollout",
    summary="--colocate (not hybrid) turns on --offload-train and --offload-rollout unless set (derived).",
)
def _colocate_offload(ctx: RuleContext) -> None:
    if not ctx.colocate or ctx.hybrid:
        return
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is None:
            ctx.derive(name, True)
        elif ctx.values[name] is False:
            ctx.warn(
                f"--colocate with --no-{FIELDS[name].flag}: the reference says colocated roles always offload, "
                "so both models must fit in GPU memory at once",
                f"remove --no-{FIELDS[name].flag} unless the models really fit together",
                fields=("colocate", FIELDS[name].flag),
            )


@rule(
    "rule.ppo_offloads_train",
    "advantage-estimator",
    "offload-train",
    summary="PPO (with a critic) always offloads the training actor (derived).",
)
def _ppo_offload(ctx: RuleContext) -> None:
    if ctx.is_ppo and not ctx.is_sft and ctx.offload_train is not True:
        ctx.derive("offload_train", True)


@rule(
    "rule.offload_defaults",
    "offload-train",
    "offload-rollout",
    summary="--offload-train / --offload-rollout left unset resolve to false (derived).",
)
def _offload_defaults(ctx: RuleContext) -> None:
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is None:
            ctx.derive(name, False)


# =============================================================================================
# Batch sizes

_WHOLE_STEPS = (
    "The platform splits every rollout into whole optimizer steps of --global-batch-size samples, so the "
    "rollout's samples must be a multiple of it (slime, which Relax derives from, checks this at start-up; "
    "Relax's code does not, and a remainder would not be a whole step)."
)


@rule(
    "rule.rollout_batch_size_required",
    "rollout-batch-size",
    "global-batch-size",
    "n-samples-per-prompt",
    summary="--rollout-batch-size is required; Relax derives it as global_batch_size // n_samples_per_prompt "
    "when only --global-batch-size is given.",
    deviation="When --global-batch-size is not a multiple of --n-samples-per-prompt, Relax floors the "
    "division; the platform refuses it. " + _WHOLE_STEPS,
)
def _rbs_required(ctx: RuleContext) -> None:
    if ctx.rollout_batch_size is not None:
        return
    if ctx.global_batch_size is None:
        ctx.error(
            "--rollout-batch-size is required (prompts per rollout round)",
            "set --rollout-batch-size, e.g. --rollout-batch-size 32",
            fields=("rollout-batch-size",),
        )
        return
    if ctx.global_batch_size % ctx.n_samples_per_prompt:
        ctx.error(
            f"--rollout-batch-size is not set and --global-batch-size {ctx.global_batch_size} is not a multiple "
            f"of --n-samples-per-prompt {ctx.n_samples_per_prompt}, so it cannot be derived",
            "set --rollout-batch-size",
        )
        return
    ctx.derive("rollout_batch_size", ctx.global_batch_size // ctx.n_samples_per_prompt)


@rule(
    "rule.num_steps_per_rollout_sets_global_batch_size",
    "num-steps-per-rollout",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="--num-steps-per-rollout derives global_batch_size = rollout_batch_size * n_samples_per_prompt / "
    "num_steps_per_rollout; it must divide, and a different explicit --global-batch-size is an error.",
    deviation="When --num-steps-per-rollout does not divide the rollout's samples, Relax floors the "
    "division; the platform refuses it. " + _WHOLE_STEPS,
)
def _steps_per_rollout(ctx: RuleContext) -> None:
    steps = ctx.num_steps_per_rollout
    if steps is None or ctx.rollout_batch_size is None:
        return
    samples = ctx.rollout_batch_size * ctx.n_samples_per_prompt
    if samples % steps:
        ctx.error(
            f"rollout_batch_size * n_samples_per_prompt = {ctx.rollout_batch_size} * {ctx.n_samples_per_prompt} "
            f"= {samples} samples cannot be split into --num-steps-per-rollout {steps} equal steps",
            f"choose --num-steps-per-rollout dividing {samples}",
        )
        return
    gbs = samples // steps
    if ctx.global_batch_size is not None and ctx.global_batch_size != gbs:
        ctx.error(
            f"--global-batch-size {ctx.global_batch_size} contradicts --num-steps-per-rollout {steps}, which "
            f"implies {samples} / {steps} = {gbs}",
            "set only one of --global-batch-size and --num-steps-per-rollout",
        )
        return
    if ctx.global_batch_size is None:
        ctx.derive("global_batch_size", gbs)


@rule(
    "rule.global_batch_size_divides_rollout",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="--global-batch-size must divide rollout_batch_size * n_samples_per_prompt.",
    deviation="Relax's code does not check it. " + _WHOLE_STEPS,
)
def _gbs_divides(ctx: RuleContext) -> None:
    gbs, rbs = ctx.global_batch_size, ctx.rollout_batch_size
    if gbs is None or rbs is None or "global_batch_size" in ctx.derived:
        return
    samples = rbs * ctx.n_samples_per_prompt
    if samples % gbs:
        ctx.error(
            f"--global-batch-size {gbs} does not divide rollout_batch_size * n_samples_per_prompt = "
            f"{rbs} * {ctx.n_samples_per_prompt} = {samples}",
            f"use a --global-batch-size that divides {samples} (or set --num-steps-per-rollout)",
        )


@rule(
    "rule.over_sampling_batch_size",
    "over-sampling-batch-size",
    "rollout-batch-size",
    summary="--over-sampling-batch-size defaults to --rollout-batch-size and must be >= it.",
)
def _over_sampling(ctx: RuleContext) -> None:
    if ctx.rollout_batch_size is None:
        return
    if ctx.over_sampling_batch_size is None:
        ctx.derive("over_sampling_batch_size", ctx.rollout_batch_size)
        return
    if ctx.over_sampling_batch_size < ctx.rollout_batch_size:
        ctx.error(
            f"--over-sampling-batch-size {ctx.over_sampling_batch_size} is smaller than --rollout-batch-size "
            f"{ctx.rollout_batch_size}",
            f"set --over-sampling-batch-size >= {ctx.rollout_batch_size} or leave it unset",
        )
    elif ctx.over_sampling_batch_size > ctx.rollout_batch_size and not (
        ctx.fully_async or ctx.partial_rollout
    ):
        ctx.warn(
            f"--over-sampling-batch-size {ctx.over_sampling_batch_size} > --rollout-batch-size "
            f"{ctx.rollout_batch_size} without --fully-async or --partial-rollout: surplus groups are "
            "discarded each step, not carried over",
            "add --partial-rollout, or set both sizes equal",
            fields=("over-sampling-batch-size", "rollout-batch-size", "partial-rollout", "fully-async"),
        )


@rule(
    "rule.num_rollout_or_num_epoch",
    "num-rollout",
    "num-epoch",
    summary="Set --num-rollout or --num-epoch; with both, --num-rollout wins (warning).",
)
def _num_rollout(ctx: RuleContext) -> None:
    if ctx.num_rollout is None and ctx.num_epoch is None:
        ctx.error("neither --num-rollout nor --num-epoch is set", "set --num-rollout (or --num-epoch)")
    elif ctx.num_rollout is not None and ctx.num_epoch is not None:
        ctx.warn(
            f"--num-rollout {ctx.num_rollout} and --num-epoch {ctx.num_epoch} are both set; --num-epoch is ignored",
            "remove --num-epoch",
        )


@rule(
    "rule.num_epoch_needs_rollout_global_dataset",
    "num-epoch",
    "disable-rollout-global-dataset",
    summary="RL with --num-epoch counts epochs of the global dataset: --disable-rollout-global-dataset cannot "
    "be set with it.",
)
def _num_epoch_dataset(ctx: RuleContext) -> None:
    if ctx.num_epoch is not None and not ctx.is_sft and not ctx.rollout_global_dataset:
        ctx.error(
            "--num-epoch counts passes over the global dataset, but --disable-rollout-global-dataset turns it off",
            "remove --disable-rollout-global-dataset, or use --num-rollout",
        )


@rule(
    "rule.dynamic_batch_needs_max_tokens_per_gpu",
    "use-dynamic-batch-size",
    "max-tokens-per-gpu",
    summary="--use-dynamic-batch-size needs --max-tokens-per-gpu.",
)
def _dynamic_needs_tokens(ctx: RuleContext) -> None:
    if ctx.use_dynamic_batch_size and ctx.max_tokens_per_gpu is None:
        ctx.error(
            "--use-dynamic-batch-size is set without --max-tokens-per-gpu",
            "set --max-tokens-per-gpu (about max_response_len / context_parallel_size)",
        )


@rule(
    "rule.log_probs_max_tokens_per_gpu_default",
    "log-probs-max-tokens-per-gpu",
    "max-tokens-per-gpu",
    summary="--log-probs-max-tokens-per-gpu defaults to --max-tokens-per-gpu (derived).",
)
def _log_probs_tokens(ctx: RuleContext) -> None:
    if ctx.log_probs_max_tokens_per_gpu is None and ctx.max_tokens_per_gpu is not None:
        ctx.derive("log_probs_max_tokens_per_gpu", ctx.max_tokens_per_gpu)


@rule(
    "rule.dynamic_batch_token_budget",
    "max-tokens-per-gpu",
    "context-parallel-size",
    "rollout-max-context-len",
    summary="With dynamic batching, max_tokens_per_gpu * context_parallel_size must hold rollout_max_context_len.",
)
def _token_budget(ctx: RuleContext) -> None:
    if (
        not ctx.use_dynamic_batch_size
        or ctx.max_tokens_per_gpu is None
        or ctx.rollout_max_context_len is None
    ):
        return
    budget = ctx.max_tokens_per_gpu * ctx.context_parallel_size
    if budget < ctx.rollout_max_context_len:
        ctx.error(
            f"max_tokens_per_gpu * context_parallel_size = {ctx.max_tokens_per_gpu} * {ctx.context_parallel_size} "
            f"= {budget} < rollout_max_context_len {ctx.rollout_max_context_len}: one long sample would form an "
            "oversized micro-batch and run out of memory",
            "raise --max-tokens-per-gpu (or --context-parallel-size), or lower --rollout-max-context-len",
        )


@rule(
    "rule.bshd_without_dynamic_batch",
    "qkv-format",
    "use-dynamic-batch-size",
    summary="--qkv-format bshd does not support --use-dynamic-batch-size.",
)
def _bshd_dynamic(ctx: RuleContext) -> None:
    if ctx.qkv_format == "bshd" and ctx.use_dynamic_batch_size:
        ctx.error(
            "--qkv-format bshd does not support --use-dynamic-batch-size",
            "remove --use-dynamic-batch-size and set --micro-batch-size, or use --qkv-format thd",
        )


@rule(
    "rule.bshd_needs_micro_batch_size",
    "qkv-format",
    "micro-batch-size",
    summary="--qkv-format bshd batches statically by --micro-batch-size: set it explicitly (warning).",
)
def _bshd_mbs(ctx: RuleContext) -> None:
    if ctx.qkv_format == "bshd" and not ctx.given("micro_batch_size"):
        ctx.warn(
            "--qkv-format bshd batches by --micro-batch-size, which is not set (default 1)",
            "set --micro-batch-size explicitly",
        )


@rule(
    "rule.bshd_needs_megatron",
    "qkv-format",
    "train-backend",
    summary="--qkv-format bshd is only supported by the megatron backend.",
)
def _bshd_backend(ctx: RuleContext) -> None:
    if ctx.qkv_format == "bshd" and ctx.train_backend != "megatron":
        ctx.error(
            f"--qkv-format bshd needs --train-backend megatron, got {ctx.train_backend}",
            "remove --qkv-format bshd",
        )


@rule(
    "rule.micro_batch_size_ignored_with_dynamic_batch",
    "micro-batch-size",
    "use-dynamic-batch-size",
    summary="--micro-batch-size is ignored with --use-dynamic-batch-size (warning).",
)
def _mbs_ignored(ctx: RuleContext) -> None:
    if ctx.use_dynamic_batch_size and ctx.given("micro_batch_size") and ctx.micro_batch_size != 1:
        ctx.warn(
            f"--micro-batch-size {ctx.micro_batch_size} is ignored with --use-dynamic-batch-size",
            "remove --micro-batch-size",
        )


@rule(
    "rule.balance_data_no_effect_fully_async",
    "balance-data",
    "fully-async",
    "use-dynamic-batch-size",
    summary="--balance-data changes nothing in fully-async mode with dynamic batching (warning).",
)
def _balance_noop(ctx: RuleContext) -> None:
    if ctx.balance_data and ctx.fully_async and ctx.use_dynamic_batch_size and ctx.given("balance_data"):
        ctx.warn(
            "--balance-data has no extra effect: fully-async dynamic batching already balances tokens across DP ranks",
            "remove --balance-data",
        )


# =============================================================================================
# Checkpoints


@rule("rule.save_interval_needs_save", "save-interval", "save", summary="--save-interval needs --save.")
def _save_interval(ctx: RuleContext) -> None:
    if ctx.save_interval is not None and ctx.save is None:
        ctx.error(f"--save-interval {ctx.save_interval} is set but --save is not", "set --save DIR")


@rule(
    "rule.rotate_ckpt_requirements",
    "rotate-ckpt",
    "save",
    "save-interval",
    "async-save",
    summary="--rotate-ckpt needs --save, --save-interval and --async-save.",
)
def _rotate(ctx: RuleContext) -> None:
    if not ctx.rotate_ckpt:
        return
    missing = [n for n in ("save", "save_interval") if ctx.values[n] is None]
    if not ctx.async_save:
        missing.append("async_save")
    if missing:
        ctx.error(f"--rotate-ckpt needs {_flags(*missing)}", f"add {_flags(*missing)}")


@rule(
    "rule.max_actor_ckpt_to_keep_needs_save",
    "max-actor-ckpt-to-keep",
    "save",
    summary="--max-actor-ckpt-to-keep only matters with --save (warning).",
)
def _keep(ctx: RuleContext) -> None:
    if ctx.max_actor_ckpt_to_keep is not None and ctx.save is None:
        ctx.warn(
            "--max-actor-ckpt-to-keep is set but nothing is saved (--save is not set)",
            "set --save or remove it",
        )


@rule(
    "rule.hf_checkpoint_required",
    "hf-checkpoint",
    summary="--hf-checkpoint is required: it initialises SGLang and provides the tokenizer.",
    deviation="Relax's start-up checks do not require it; a job without it fails later, when Relax loads the "
    "tokenizer or starts SGLang. The platform refuses it at submission instead.",
)
def _hf(ctx: RuleContext) -> None:
    if ctx.hf_checkpoint is None:
        ctx.error(
            "--hf-checkpoint is not set; Relax needs it for the tokenizer and to start SGLang",
            "set --hf-checkpoint to a Hugging Face model directory",
        )


@rule(
    "rule.initial_weights",
    "load",
    "ref-load",
    "hf-checkpoint",
    "megatron-to-hf-mode",
    summary="The megatron backend in raw mode starts from --load or --ref-load; without either it starts "
    "from random weights (warning).",
)
def _initial(ctx: RuleContext) -> None:
    if (
        ctx.train_backend == "megatron"
        and ctx.megatron_to_hf_mode == "raw"
        and not ctx.debug_rollout_only
        and ctx.load is None
        and ctx.ref_load is None
    ):
        ctx.warn(
            "neither --load nor --ref-load is set: in raw mode Megatron would start from random weights "
            "(--hf-checkpoint only provides the architecture and tokenizer)",
            "set --ref-load to a Megatron checkpoint, or use --megatron-to-hf-mode bridge to load --hf-checkpoint",
        )


# =============================================================================================
# KL and reference model


@rule(
    "rule.kl_coef_and_kl_loss_coef",
    "kl-coef",
    "kl-loss-coef",
    summary="--kl-coef and --kl-loss-coef cannot both be non-zero.",
)
def _kl_both(ctx: RuleContext) -> None:
    if ctx.kl_coef != 0 and ctx.kl_loss_coef != 0:
        ctx.error(
            f"--kl-coef {ctx.kl_coef} (reward shaping) and --kl-loss-coef {ctx.kl_loss_coef} (loss term) are both "
            "non-zero",
            "keep one KL term: set the other to 0",
        )


@rule(
    "rule.kl_loss_coef_without_use_kl_loss",
    "kl-loss-coef",
    "use-kl-loss",
    summary="--kl-loss-coef has no effect without --use-kl-loss, and --use-kl-loss with coefficient 0 adds "
    "nothing (warnings).",
)
def _kl_loss_flag(ctx: RuleContext) -> None:
    if ctx.kl_loss_coef != 0 and not ctx.use_kl_loss:
        ctx.warn(
            f"--kl-loss-coef {ctx.kl_loss_coef} has no effect without --use-kl-loss", "add --use-kl-loss"
        )
    elif ctx.use_kl_loss and ctx.kl_loss_coef == 0:
        ctx.warn(
            "--use-kl-loss with --kl-loss-coef 0 adds no KL term, but Relax still loads the reference model",
            "set --kl-loss-coef > 0 or remove --use-kl-loss",
        )


@rule(
    "rule.kl_needs_reference_model",
    "use-kl-loss",
    "kl-coef",
    "ref-load",
    summary="A KL term (--use-kl-loss, or --kl-coef != 0) needs a reference model: --ref-load "
    "(Relax's start-up check; --hf-checkpoint and --load do not stand in for it).",
)
def _kl_ref(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.ref_load is not None:
        return
    if ctx.use_kl_loss or ctx.kl_coef != 0:
        which = "--use-kl-loss" if ctx.use_kl_loss else f"--kl-coef {ctx.kl_coef}"
        ctx.error(
            f"{which} needs a reference model, but --ref-load is not set",
            "set --ref-load to the reference (initial) Megatron checkpoint, or drop the KL term",
        )


@rule(
    "rule.ref_update_interval_needs_ref_load",
    "ref-update-interval",
    "ref-load",
    summary="--ref-update-interval updates a reference model: without --ref-load it has nothing to update "
    "(warning; Relax ignores it).",
)
def _ref_update(ctx: RuleContext) -> None:
    if ctx.ref_update_interval is not None and ctx.ref_load is None:
        ctx.warn(
            "--ref-update-interval is set but there is no reference model (--ref-load), so it has no effect",
            "set --ref-load, or remove --ref-update-interval",
        )


@rule(
    "rule.eps_clip_high_default",
    "eps-clip-high",
    "eps-clip",
    summary="--eps-clip-high defaults to --eps-clip (derived).",
)
def _eps(ctx: RuleContext) -> None:
    if ctx.eps_clip_high is None:
        ctx.derive("eps_clip_high", ctx.eps_clip)


# =============================================================================================
# Algorithm and loss


@rule(
    "rule.custom_loss_needs_function_path",
    "loss-type",
    "custom-loss-function-path",
    summary="--loss-type custom_loss needs --custom-loss-function-path (a path without it is a warning).",
    deviation="Relax's start-up checks do not look for the path; the job would fail when it first computes "
    "the loss. The platform refuses it at submission.",
)
def _custom_loss(ctx: RuleContext) -> None:
    if ctx.loss_type == "custom_loss" and ctx.custom_loss_function_path is None:
        ctx.error(
            "--loss-type custom_loss needs --custom-loss-function-path",
            "set --custom-loss-function-path my_pkg.losses.my_loss",
        )
    elif ctx.loss_type != "custom_loss" and ctx.custom_loss_function_path is not None:
        ctx.warn(
            f"--custom-loss-function-path is ignored with --loss-type {ctx.loss_type}",
            "add --loss-type custom_loss or remove the path",
        )


@rule(
    "rule.reinforce_plus_plus_needs_normalize_advantages",
    "advantage-estimator",
    "normalize-advantages",
    summary="reinforce_plus_plus and reinforce_plus_plus_baseline need --normalize-advantages.",
)
def _rpp(ctx: RuleContext) -> None:
    if ctx.is_sft:
        return
    if ctx.advantage_estimator.startswith("reinforce_plus_plus") and not ctx.normalize_advantages:
        ctx.error(
            f"--advantage-estimator {ctx.advantage_estimator} needs --normalize-advantages",
            "add --normalize-advantages",
        )


GRPO_FAMILY = ("grpo", "gspo", "sapo", "cispo")
_RLOO = (
    "rloo is a Relax Platform estimator: the zh reference lists it in Relax's registry, but neither eb15c45 "
    "nor main defines it; this is what the platform's implementation needs."
)


@rule(
    "rule.kl_coef_ignored_by_grpo_family",
    "kl-coef",
    "advantage-estimator",
    summary="--kl-coef is reward shaping that grpo, gspo, sapo and cispo do not apply (as in Relax): a "
    "warning suggesting --use-kl-loss.",
)
def _kl_coef_grpo(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.kl_coef != 0 and ctx.advantage_estimator in GRPO_FAMILY:
        ctx.warn(
            f"--kl-coef {ctx.kl_coef} has no effect with --advantage-estimator {ctx.advantage_estimator}: "
            "its advantages take no reward-side KL (Relax computes the KL, but does not apply it)",
            "use --use-kl-loss with --kl-loss-coef for a KL term, or remove --kl-coef",
            fields=("kl-coef", "advantage-estimator"),
        )


@rule(
    "rule.rloo_one_step_per_rollout",
    "advantage-estimator",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="rloo's REINFORCE loss has no importance ratio: each rollout must train in one optimizer step "
    "(global_batch_size == rollout_batch_size * n_samples_per_prompt), and needs groups of >= 2 samples.",
    deviation=_RLOO,
)
def _rloo_steps(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.advantage_estimator != "rloo" or ctx.rollout_batch_size is None:
        return
    samples = ctx.rollout_batch_size * ctx.n_samples_per_prompt
    if ctx.global_batch_size is not None and ctx.global_batch_size != samples:
        ctx.error(
            f"--advantage-estimator rloo trains without an importance ratio, so every optimizer step must use "
            f"samples of the current policy; --global-batch-size {ctx.global_batch_size} splits the "
            f"{samples} samples of a rollout into {samples // max(ctx.global_batch_size, 1)} steps",
            f"set --global-batch-size {samples} (one step per rollout), or use grpo, which clips the ratio",
            fields=("advantage-estimator", "global-batch-size"),
        )
    if ctx.n_samples_per_prompt < 2:
        ctx.error(
            "--advantage-estimator rloo's baseline is the mean of the other samples of the prompt: it needs "
            f"--n-samples-per-prompt >= 2 (got {ctx.n_samples_per_prompt})",
            "set --n-samples-per-prompt 2 or more",
            fields=("advantage-estimator", "n-samples-per-prompt"),
        )


@rule(
    "rule.rloo_without_normalize_advantages",
    "advantage-estimator",
    "normalize-advantages",
    summary="rloo keeps the reward's scale: --normalize-advantages cannot be set with it.",
    deviation=_RLOO,
)
def _rloo_norm(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.advantage_estimator == "rloo" and ctx.normalize_advantages:
        ctx.error(
            "--advantage-estimator rloo keeps the reward's scale, but --normalize-advantages whitens it "
            "(putting back the std division the leave-one-out baseline avoids)",
            "remove --normalize-advantages",
        )


@rule(
    "rule.group_baseline_needs_rewards_normalization",
    "advantage-estimator",
    "disable-rewards-normalization",
    summary="rloo subtracts a leave-one-out group baseline, which is its reward normalization: "
    "--disable-rewards-normalization cannot be set with it (reinforce_plus_plus_baseline takes it, as in "
    "Relax: its advantages are then the raw rewards).",
    deviation=_RLOO,
)
def _group_baseline(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.advantage_estimator == "rloo" and ctx.disable_rewards_normalization:
        ctx.error(
            "--advantage-estimator rloo's leave-one-out baseline is its reward normalization, but "
            "--disable-rewards-normalization turns it off",
            "remove --disable-rewards-normalization",
        )


@rule(
    "rule.fully_async_without_normalize_advantages",
    "fully-async",
    "normalize-advantages",
    summary="--normalize-advantages is not supported with --fully-async.",
)
def _fa_norm(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.fully_async and ctx.normalize_advantages:
        ctx.error(
            "--normalize-advantages is not supported in fully-async mode", "remove --normalize-advantages"
        )


@rule(
    "rule.fully_async_without_dynamic_global_batch_size",
    "fully-async",
    "use-dynamic-global-batch-size",
    summary="--use-dynamic-global-batch-size is only supported in colocate mode, not with --fully-async.",
)
def _fa_dynamic_gbs(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.fully_async and ctx.use_dynamic_global_batch_size:
        ctx.error(
            "--use-dynamic-global-batch-size is only supported in colocate mode, but --fully-async is set",
            "remove --use-dynamic-global-batch-size",
        )


@rule(
    "rule.single_sample_disables_grpo_std",
    "n-samples-per-prompt",
    "disable-grpo-std-normalization",
    summary="With --n-samples-per-prompt 1 there is no group std: GRPO std normalization is turned off (derived).",
)
def _n1(ctx: RuleContext) -> None:
    if ctx.n_samples_per_prompt == 1 and not ctx.disable_grpo_std_normalization:
        ctx.derive("disable_grpo_std_normalization", True)


@rule(
    "rule.fully_async_true_on_policy",
    "fully-async",
    "true-on-policy-mode",
    "global-batch-size",
    summary="In fully-async mode, rollout_batch_size * n_samples_per_prompt == global_batch_size turns on "
    "--true-on-policy-mode (derived).",
)
def _true_on_policy(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.fully_async or ctx.true_on_policy_mode or ctx.rollout_batch_size is None:
        return
    if ctx.global_batch_size == ctx.rollout_batch_size * ctx.n_samples_per_prompt:
        ctx.derive("true_on_policy_mode", True)


@rule(
    "rule.fully_async_resource_roles",
    "fully-async",
    "resource",
    "use-kl-loss",
    "kl-coef",
    "true-on-policy-mode",
    summary="Fully-async (not hybrid) needs a 'reference' role for KL terms and an 'actor_fwd' role unless "
    "true-on-policy mode is on.",
)
def _fa_roles(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.fully_async or ctx.hybrid or ctx.resource is None:
        return
    roles = resource_roles(ctx.values)
    if (ctx.use_kl_loss or ctx.kl_coef != 0) and "reference" not in roles:
        ctx.error(
            f"fully-async KL needs a 'reference' entry in --resource (roles: {', '.join(sorted(roles))})",
            'add "reference": [1, N] to --resource',
            fields=("resource", "use-kl-loss", "kl-coef", "fully-async"),
        )
    if not ctx.true_on_policy_mode and "actor_fwd" not in roles:
        ctx.error(
            "fully-async without true-on-policy mode needs an 'actor_fwd' entry in --resource "
            f"(roles: {', '.join(sorted(roles))}); true-on-policy mode is automatic only when "
            "rollout_batch_size * n_samples_per_prompt == global_batch_size",
            'add "actor_fwd": [1, N] to --resource, or --true-on-policy-mode',
            fields=("resource", "true-on-policy-mode", "fully-async"),
        )


# =============================================================================================
# Off-policy correction, routing replay, partial rollout


@rule(
    "rule.get_mismatch_metrics_needs_tis_function",
    "get-mismatch-metrics",
    "custom-tis-function-path",
    summary="--get-mismatch-metrics needs --custom-tis-function-path.",
)
def _mismatch(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.get_mismatch_metrics and ctx.custom_tis_function_path is None:
        ctx.error("--get-mismatch-metrics needs --custom-tis-function-path", "set --custom-tis-function-path")


@rule(
    "rule.rollout_logprobs_and_tis_exclusive",
    "use-rollout-logprobs",
    "use-tis",
    summary="--use-rollout-logprobs and --use-tis cannot both be set.",
)
def _logprobs_tis(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.use_rollout_logprobs and ctx.use_tis:
        ctx.error(
            "--use-rollout-logprobs and --use-tis are both set (TIS corrects toward the actor's log-probs)",
            "keep one of them",
        )


@rule(
    "rule.tis_clip_range",
    "tis-clip-low",
    "tis-clip",
    summary="--tis-clip-low above --tis-clip clips every importance ratio to one value (warning; Relax accepts it).",
)
def _tis_range(ctx: RuleContext) -> None:
    if ctx.tis_clip_low > ctx.tis_clip:
        ctx.warn(
            f"--tis-clip-low {ctx.tis_clip_low} > --tis-clip {ctx.tis_clip}: the clipping range is empty",
            "use tis_clip_low <= tis_clip",
        )


@rule(
    "rule.rollout_routing_replay_implies_routing_replay",
    "use-rollout-routing-replay",
    "use-routing-replay",
    summary="--use-rollout-routing-replay turns on --use-routing-replay (derived).",
)
def _rrr(ctx: RuleContext) -> None:
    if ctx.use_rollout_routing_replay and not ctx.use_routing_replay:
        ctx.derive("use_routing_replay", True)


@rule(
    "rule.partial_rollout_and_rollout_routing_replay",
    "partial-rollout",
    "use-rollout-routing-replay",
    summary="--partial-rollout and --use-rollout-routing-replay are mutually exclusive.",
)
def _pr_rrr(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.partial_rollout and ctx.use_rollout_routing_replay:
        ctx.error(
            "--partial-rollout (partly off-policy samples) and --use-rollout-routing-replay (exact train/inference "
            "routing) cannot be combined",
            "keep one of them",
        )


@rule(
    "rule.partial_rollout_options",
    "partial-rollout",
    "partial-rollout-max-aborted-count",
    "mask-offpolicy-in-partial-rollout",
    summary="Partial-rollout options need --partial-rollout (warning).",
)
def _pr_opts(ctx: RuleContext) -> None:
    used = [
        n
        for n in ("partial_rollout_max_aborted_count", "mask_offpolicy_in_partial_rollout")
        if ctx.non_default(n)
    ]
    if used and not ctx.partial_rollout:
        ctx.warn(f"{_flags(*used)} only apply with --partial-rollout", "add --partial-rollout or remove them")


@rule(
    "rule.freeze_lists_exclusive",
    "only-train-params-name-list",
    "freeze-params-name-list",
    summary="--only-train-params-name-list and --freeze-params-name-list are mutually exclusive.",
)
def _freeze(ctx: RuleContext) -> None:
    if ctx.only_train_params_name_list and ctx.freeze_params_name_list:
        ctx.error(
            "--only-train-params-name-list and --freeze-params-name-list are both set", "keep one of them"
        )


# =============================================================================================
# OPD


def _opd_on(ctx: RuleContext) -> bool:
    """Relax's `validate_opd_args` runs: RL (not SFT) with --use-opd."""
    return ctx.use_opd and not ctx.is_sft


@rule("rule.use_opd_needs_opd_type", "use-opd", "opd-type", summary="--use-opd needs --opd-type.")
def _opd_type(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_type is None:
        ctx.error(
            "--use-opd needs --opd-type (sglang: teacher log-probs from an SGLang teacher; megatron: a teacher "
            "checkpoint loaded next to the policy)",
            "add --opd-type sglang",
        )
    elif not ctx.use_opd and ctx.opd_type is not None and not ctx.is_sft:
        ctx.warn(f"--opd-type {ctx.opd_type} has no effect without --use-opd", "add --use-opd")


@rule(
    "rule.opd_coefficients_exclusive",
    "opd-kl-coef",
    "opd-loss-coef",
    summary="On-policy distillation: exactly one of --opd-kl-coef (advantage mode) and --opd-loss-coef (loss "
    "mode) is non-zero.",
)
def _opd_coefs(ctx: RuleContext) -> None:
    if not _opd_on(ctx):
        return
    kl, loss = ctx.opd_kl_coef or 0.0, ctx.opd_loss_coef or 0.0
    if (kl != 0) == (loss != 0):
        ctx.error(
            f"exactly one of --opd-kl-coef and --opd-loss-coef must be non-zero, got --opd-kl-coef {kl} and "
            f"--opd-loss-coef {loss}",
            "advantage mode: --opd-kl-coef X --opd-loss-coef 0; loss mode: --opd-kl-coef 0 --opd-loss-coef X",
        )


@rule(
    "rule.opd_token_selection_needs_top_k",
    "opd-token-selection",
    "opd-log-prob-top-k",
    summary="--opd-token-selection other than student_sampled needs --opd-log-prob-top-k > 0.",
)
def _opd_top_k(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_token_selection != "student_sampled" and ctx.opd_log_prob_top_k <= 0:
        ctx.error(
            f"--opd-token-selection {ctx.opd_token_selection} compares top-k token sets, but "
            f"--opd-log-prob-top-k is {ctx.opd_log_prob_top_k}",
            "set --opd-log-prob-top-k > 0 (e.g. 20), or use --opd-token-selection student_sampled",
        )


@rule(
    "rule.opd_kl_type_for_sampled_tokens",
    "opd-token-selection",
    "opd-kl-type",
    summary="--opd-token-selection student_sampled needs a reverse-KL estimator: --opd-kl-type reverse_kl or "
    "low_var_kl.",
)
def _opd_kl_type(ctx: RuleContext) -> None:
    if (
        _opd_on(ctx)
        and ctx.opd_token_selection == "student_sampled"
        and ctx.opd_kl_type not in ("reverse_kl", "low_var_kl")
    ):
        ctx.error(
            f"--opd-kl-type {ctx.opd_kl_type} is not a reverse-KL estimator, which the student's sampled tokens "
            "need",
            "use --opd-kl-type reverse_kl or low_var_kl, or a top-k --opd-token-selection",
        )


@rule(
    "rule.opd_megatron_needs_teacher_load",
    "opd-type",
    "opd-teacher-load",
    summary="--opd-type megatron needs --opd-teacher-load.",
)
def _opd_megatron(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_type == "megatron" and ctx.opd_teacher_load is None:
        ctx.error(
            "--opd-type megatron needs --opd-teacher-load (the teacher checkpoint)", "set --opd-teacher-load"
        )


@rule(
    "rule.opd_clips_positive",
    "opd-per-token-clip",
    "opd-is-clip",
    summary="--opd-per-token-clip and --opd-is-clip, when set, are upper bounds > 0.",
)
def _opd_clips(ctx: RuleContext) -> None:
    if not _opd_on(ctx):
        return
    for name in ("opd_per_token_clip", "opd_is_clip"):
        value = ctx.values[name]
        if value is not None and value <= 0:
            ctx.error(
                f"{_flags(name)} is {value}, but it is an upper bound on a positive quantity and must be > 0",
                f"set {_flags(name)} > 0 (e.g. 10), or leave it unset to disable the clip",
                fields=(FIELDS[name].flag,),
            )


@rule(
    "rule.opd_is_clip_needs_loss_mode",
    "opd-is-clip",
    "opd-loss-coef",
    summary="--opd-is-clip acts in OPD's loss mode only (--opd-loss-coef > 0); otherwise a warning (Relax logs "
    "it and ignores the clip).",
)
def _opd_is_clip_mode(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_is_clip is not None and not ctx.opd_loss_coef:
        ctx.warn(
            "--opd-is-clip weights the OPD loss term, but --opd-loss-coef is 0 (advantage mode): it has no effect",
            "remove --opd-is-clip, or use loss mode: --opd-kl-coef 0 --opd-loss-coef X",
        )


@rule(
    "rule.opd_teacher_inputs_need_sglang",
    "opd-teacher-prompt-key",
    "opd-teacher-image-key",
    "opd-type",
    summary="--opd-teacher-prompt-key and --opd-teacher-image-key (on-policy self-distillation's teacher-side "
    "inputs) need --opd-type sglang: a teacher held by the trainer scores the student's own tokens.",
)
def _opd_teacher_inputs(ctx: RuleContext) -> None:
    if not _opd_on(ctx) or ctx.opd_type == "sglang":
        return
    for name in ("opd_teacher_prompt_key", "opd_teacher_image_key"):
        if ctx.values[name] is not None:
            ctx.error(
                f"{_flags(name)} gives the teacher its own inputs, which only an SGLang teacher reads (the "
                f"trainer's teacher forwards the student's tokens), but --opd-type is {ctx.opd_type}",
                f"remove {_flags(name)}, or use --opd-type sglang",
                fields=(FIELDS[name].flag, "opd-type"),
            )


@rule(
    "rule.opd_sglang_teacher_source",
    "opd-type",
    "opd-teacher-url",
    "teacher-hf-checkpoint",
    "opd-teacher-routes",
    "opd-teacher-load",
    summary="--opd-type sglang takes teacher log-probs from --opd-teacher-url or from a Relax-managed teacher "
    "(--teacher-hf-checkpoint or --opd-teacher-routes with a 'teacher' entry in --resource), and must not set "
    "--opd-teacher-load.",
)
def _opd_sglang(ctx: RuleContext) -> None:
    if not (_opd_on(ctx) and ctx.opd_type == "sglang"):
        return
    if ctx.opd_teacher_load is not None:
        ctx.error(
            "--opd-teacher-load is set with --opd-type sglang (the teacher is an SGLang server, reached by URL)",
            "remove --opd-teacher-load",
            fields=("opd-type", "opd-teacher-load"),
        )
    if ctx.opd_teacher_url is not None or managed_teacher(ctx.values) or ctx.opd_teacher_routes is not None:
        return  # a URL, a managed teacher, or routes (checked by rule.opd_teacher_routes)
    if ctx.teacher_hf_checkpoint is not None:
        ctx.error(
            "--teacher-hf-checkpoint starts a Relax-managed teacher only with a 'teacher' entry in --resource",
            'add "teacher": [1, N] to --resource (the teacher\'s GPUs)',
            fields=("teacher-hf-checkpoint", "resource"),
        )
        return
    ctx.error(
        "--opd-type sglang needs a teacher: --opd-teacher-url (an SGLang /generate endpoint), or "
        "--teacher-hf-checkpoint with a 'teacher' entry in --resource for a Relax-managed one",
        "set --opd-teacher-url http://host:port/generate",
        fields=("opd-type", "opd-teacher-url", "teacher-hf-checkpoint"),
    )


@rule(
    "rule.opd_teacher_routes",
    "opd-teacher-routes",
    "teacher-hf-checkpoint",
    "resource",
    summary="--opd-teacher-routes (sglang multi-teacher OPD) is a non-empty JSON object of data_source -> HF "
    "checkpoint, excludes --teacher-hf-checkpoint, and needs a 'teacher' entry in --resource.",
)
def _opd_routes(ctx: RuleContext) -> None:
    routes = ctx.opd_teacher_routes
    if not (_opd_on(ctx) and ctx.opd_type == "sglang") or routes is None:
        return
    try:
        parsed = json.loads(routes)
    except ValueError as exc:
        ctx.error(
            f"--opd-teacher-routes is not valid JSON: {exc}",
            'write a JSON object, e.g. \'{"openai/gsm8k": "/models/Qwen3-8B"}\'',
            fields=("opd-teacher-routes",),
        )
        return
    if not isinstance(parsed, dict) or not parsed:
        ctx.error(
            "--opd-teacher-routes must be a non-empty JSON object mapping data_source to a teacher checkpoint",
            'e.g. \'{"openai/gsm8k": "/models/Qwen3-8B"}\'',
            fields=("opd-teacher-routes",),
        )
        return
    if ctx.teacher_hf_checkpoint is not None:
        ctx.error(
            "--opd-teacher-routes (several teachers) and --teacher-hf-checkpoint (one teacher) are both set",
            "keep one of them",
            fields=("opd-teacher-routes", "teacher-hf-checkpoint"),
        )
    if "teacher" not in resource_roles(ctx.values):
        ctx.error(
            "--opd-teacher-routes needs a 'teacher' entry in --resource: the GPUs its teachers share",
            'add "teacher": [1, N] to --resource',
            fields=("opd-teacher-routes", "resource"),
        )


@rule(
    "rule.opd_teacher_load_needs_use_opd",
    "opd-teacher-load",
    "use-opd",
    summary="--opd-teacher-load without --use-opd has no effect (warning; Relax ignores it).",
)
def _opd_teacher_without(ctx: RuleContext) -> None:
    if not ctx.use_opd and ctx.opd_teacher_load is not None and not ctx.is_sft:
        ctx.warn("--opd-teacher-load is set but --use-opd is not, so it has no effect", "add --use-opd")


@rule(
    "rule.fully_async_without_opd_megatron",
    "fully-async",
    "opd-type",
    summary="On-policy distillation with a megatron teacher (--opd-type megatron) is not supported with "
    "--fully-async.",
)
def _fa_opd(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.fully_async and ctx.opd_type == "megatron":
        ctx.error(
            "--opd-type megatron is not supported in fully-async mode",
            "use --opd-type sglang, or remove --opd-type",
        )


# =============================================================================================
# Prompt / context lengths


@rule(
    "rule.rollout_max_prompt_len_default",
    "rollout-max-prompt-len",
    "rollout-max-context-len",
    summary="--rollout-max-prompt-len defaults to rollout_max_context_len - 1 and must not exceed it "
    "(at least one generated token).",
)
def _prompt_default(ctx: RuleContext) -> None:
    ctx_len = ctx.rollout_max_context_len
    if ctx_len is None:
        return
    if ctx.rollout_max_prompt_len is None:
        ctx.derive("rollout_max_prompt_len", ctx_len - 1)
    elif ctx.rollout_max_prompt_len > ctx_len - 1:
        ctx.error(
            f"--rollout-max-prompt-len {ctx.rollout_max_prompt_len} must be < --rollout-max-context-len {ctx_len} "
            "so that at least one token is generated",
            f"set --rollout-max-prompt-len <= {ctx_len - 1}",
        )


@rule(
    "rule.prompt_len_within_context",
    "rollout-max-prompt-len",
    "rollout-max-response-len",
    "rollout-max-context-len",
    summary="When all three are set explicitly, rollout_max_prompt_len + rollout_max_response_len should fit in "
    "rollout_max_context_len (warning: long responses stop at the context length).",
)
def _prompt_ctx(ctx: RuleContext) -> None:
    if not all(
        ctx.given(n) and ctx.values[n] is not None
        for n in ("rollout_max_prompt_len", "rollout_max_response_len", "rollout_max_context_len")
    ):
        return
    total = ctx.rollout_max_prompt_len + ctx.rollout_max_response_len
    if total > ctx.rollout_max_context_len:
        ctx.warn(
            f"rollout_max_prompt_len + rollout_max_response_len = {ctx.rollout_max_prompt_len} + "
            f"{ctx.rollout_max_response_len} = {total} > rollout_max_context_len {ctx.rollout_max_context_len}: "
            "a long prompt leaves less than --rollout-max-response-len for the response",
            "lower the prompt or response length, or raise --rollout-max-context-len",
        )


@rule(
    "rule.context_within_position_embeddings",
    "rollout-max-context-len",
    "max-position-embeddings",
    "seq-length",
    summary="--rollout-max-context-len should not exceed the model's max position embeddings (warning).",
)
def _ctx_pos(ctx: RuleContext) -> None:
    limit = ctx.max_position_embeddings or ctx.seq_length
    if ctx.rollout_max_context_len is not None and limit is not None and ctx.rollout_max_context_len > limit:
        ctx.warn(
            f"--rollout-max-context-len {ctx.rollout_max_context_len} exceeds the model's "
            f"{'max position embeddings' if ctx.max_position_embeddings else 'sequence length'} {limit}",
            "keep it within max_position_embeddings of the model's config.json",
        )


# =============================================================================================
# Evaluation


@rule(
    "rule.eval_prompt_data_pairs",
    "eval-prompt-data",
    summary="--eval-prompt-data is name/path pairs; a lone path is read as the dataset 'aime' (derived, warned).",
)
def _eval_pairs(ctx: RuleContext) -> None:
    data = ctx.eval_prompt_data
    if not data:
        return
    if len(data) == 1:
        ctx.derive("eval_prompt_data", ["aime", data[0]])
        ctx.warn(
            f"--eval-prompt-data has a single path {data[0]!r}; Relax names it 'aime'",
            f"write --eval-prompt-data NAME {data[0]}",
        )
    elif len(data) % 2:
        ctx.error(
            f"--eval-prompt-data has {len(data)} items; it takes name/path pairs",
            "write --eval-prompt-data name1 path1 name2 path2",
        )


@rule(
    "rule.eval_config_overrides_eval_prompt_data",
    "eval-config",
    "eval-prompt-data",
    summary="--eval-config overrides --eval-prompt-data (warning when both are set).",
)
def _eval_config(ctx: RuleContext) -> None:
    if ctx.eval_config is not None and ctx.eval_prompt_data:
        ctx.warn("--eval-config overrides --eval-prompt-data", "remove --eval-prompt-data")


@rule(
    "rule.sft_eval_without_eval_config",
    "loss-type",
    "eval-config",
    summary="--loss-type sft evaluates on --eval-prompt-data or --eval-size; --eval-config is not supported.",
)
def _sft_eval_config(ctx: RuleContext) -> None:
    if ctx.is_sft and ctx.eval_config is not None:
        ctx.error(
            "--loss-type sft evaluates on --eval-prompt-data or --eval-size; --eval-config is not supported",
            "replace --eval-config with --eval-prompt-data NAME PATH (or --eval-size 0.05)",
            fields=("eval-config", "loss-type"),
        )


@rule(
    "rule.eval_interval_needs_eval_data",
    "eval-interval",
    "eval-prompt-data",
    "eval-config",
    "eval-size",
    summary="--eval-interval needs evaluation data: --eval-prompt-data or --eval-config (SFT: exactly one of "
    "--eval-prompt-data and --eval-size, unless a custom dataset class provides it).",
)
def _eval_interval(ctx: RuleContext) -> None:
    if ctx.eval_interval is None:
        return
    if ctx.is_sft:
        has_data, has_size = bool(ctx.eval_prompt_data), ctx.eval_size is not None
        if has_data and has_size:
            return  # reported by rule.eval_size_exclusive_with_eval_prompt_data
        if not (has_data or has_size or ctx.eval_config is not None or ctx.custom_dataset_class_path):
            ctx.error(
                "--eval-interval under --loss-type sft needs --eval-prompt-data or --eval-size",
                "add --eval-size 0.05 (a holdout from --prompt-data) or --eval-prompt-data NAME PATH",
            )
    elif not ctx.eval_prompt_data and ctx.eval_config is None:
        ctx.error(
            "--eval-interval is set but no evaluation data is (--eval-prompt-data or --eval-config)",
            "add --eval-prompt-data NAME PATH",
        )


@rule(
    "rule.eval_size_only_for_sft",
    "eval-size",
    "loss-type",
    summary="--eval-size is only meaningful under --loss-type sft.",
)
def _eval_size_sft(ctx: RuleContext) -> None:
    if ctx.eval_size is not None and not ctx.is_sft:
        ctx.error(
            f"--eval-size is only used with --loss-type sft (got --loss-type {ctx.loss_type})",
            "use --eval-prompt-data for RL evaluation",
        )


@rule(
    "rule.eval_size_exclusive_with_eval_prompt_data",
    "eval-size",
    "eval-prompt-data",
    summary="--eval-size and --eval-prompt-data are mutually exclusive: an error with --eval-interval (Relax's "
    "check), a warning otherwise.",
)
def _eval_size_excl(ctx: RuleContext) -> None:
    if ctx.eval_size is None or not ctx.eval_prompt_data:
        return
    if ctx.eval_interval is not None:
        ctx.error("--eval-size and --eval-prompt-data are both set", "keep one eval source")
    else:
        ctx.warn(
            "--eval-size and --eval-prompt-data are both set; they are alternative eval sources",
            "keep one eval source",
        )


@rule(
    "rule.eval_size_fraction_or_count",
    "eval-size",
    summary="--eval-size is a fraction (< 1) or a whole sample count (>= 1); a count with a fraction is a "
    "warning.",
)
def _eval_size_value(ctx: RuleContext) -> None:
    size = ctx.eval_size
    if size is not None and size >= 1 and not float(size).is_integer():
        ctx.warn(
            f"--eval-size {size} is >= 1, so it is a sample count, but it is not a whole number",
            "use a fraction below 1 (e.g. 0.05) or a whole count (e.g. 500)",
        )


@rule(
    "rule.sft_predict_interval_requirements",
    "sft-predict-interval",
    "loss-type",
    "save",
    "eval-prompt-data",
    "eval-config",
    "eval-size",
    summary="--sft-predict-interval needs --loss-type sft, --save and an eval source.",
)
def _predict(ctx: RuleContext) -> None:
    if ctx.sft_predict_interval is None:
        return
    if not ctx.is_sft:
        ctx.error(
            "--sft-predict-interval is only used with --loss-type sft",
            "remove it",
            fields=("sft-predict-interval", "loss-type"),
        )
    if ctx.save is None:
        ctx.error(
            "--sft-predict-interval writes <save>/predict/, but --save is not set",
            "set --save",
            fields=("sft-predict-interval", "save"),
        )
    if not ctx.eval_prompt_data and ctx.eval_config is None and ctx.eval_size is None:
        ctx.error(
            "--sft-predict-interval needs an eval source: --eval-prompt-data, --eval-config or --eval-size",
            "add --eval-size 0.05",
            fields=("sft-predict-interval", "eval-prompt-data", "eval-config", "eval-size"),
        )


@rule(
    "rule.eval_function_path_default",
    "eval-function-path",
    "rollout-function-path",
    summary="--eval-function-path defaults to --rollout-function-path (derived).",
)
def _eval_fn(ctx: RuleContext) -> None:
    if ctx.eval_function_path is None:
        ctx.derive("eval_function_path", ctx.rollout_function_path)


@rule(
    "rule.eval_input_key_default",
    "eval-input-key",
    "input-key",
    summary="--eval-input-key defaults to --input-key (derived).",
)
def _eval_input(ctx: RuleContext) -> None:
    if ctx.eval_input_key is None:
        ctx.derive("eval_input_key", ctx.input_key)


@rule(
    "rule.eval_max_context_len_default",
    "eval-max-context-len",
    "rollout-max-context-len",
    summary="--eval-max-context-len defaults to --rollout-max-context-len (derived).",
)
def _eval_ctx(ctx: RuleContext) -> None:
    if ctx.eval_max_context_len is None and ctx.rollout_max_context_len is not None:
        ctx.derive("eval_max_context_len", ctx.rollout_max_context_len)


@rule(
    "rule.eval_reward_key_default",
    "eval-reward-key",
    "reward-key",
    summary="--eval-reward-key defaults to --reward-key (derived).",
)
def _eval_reward_key(ctx: RuleContext) -> None:
    if ctx.eval_reward_key is None and ctx.reward_key is not None:
        ctx.derive("eval_reward_key", ctx.reward_key)


# =============================================================================================
# SFT


@rule(
    "rule.sft_needs_prompt_data",
    "loss-type",
    "prompt-data",
    "custom-dataset-class-path",
    summary="--loss-type sft needs --prompt-data (unless --custom-dataset-class-path provides data).",
)
def _sft_data(ctx: RuleContext) -> None:
    if ctx.is_sft and ctx.prompt_data is None and ctx.custom_dataset_class_path is None:
        ctx.error("--loss-type sft needs --prompt-data", "set --prompt-data PATH")


@rule(
    "rule.sft_needs_dynamic_batch_size",
    "loss-type",
    "use-dynamic-batch-size",
    summary="--loss-type sft needs --use-dynamic-batch-size (with --max-tokens-per-gpu).",
)
def _sft_dynamic(ctx: RuleContext) -> None:
    if ctx.is_sft and not ctx.use_dynamic_batch_size:
        ctx.error(
            "--loss-type sft needs --use-dynamic-batch-size: SFT bounds per-GPU tokens and filters over-long "
            "samples through dynamic batching",
            "add --use-dynamic-batch-size --max-tokens-per-gpu N",
        )


@rule(
    "rule.sft_balances_data",
    "loss-type",
    "balance-data",
    summary="--loss-type sft turns on --balance-data (derived): its sampler hands DP ranks uneven counts.",
)
def _sft_balance(ctx: RuleContext) -> None:
    if ctx.is_sft and not ctx.balance_data:
        ctx.derive("balance_data", True)


@rule(
    "rule.sft_oversize_custom_needs_function_path",
    "sft-oversize-strategy",
    "sft-oversize-custom-function-path",
    summary="--sft-oversize-strategy custom needs --sft-oversize-custom-function-path (a path without it is a warning).",
)
def _oversize(ctx: RuleContext) -> None:
    if not ctx.is_sft:
        return  # Relax reads these only under SFT (rule.sft_options_need_sft warns)
    if ctx.sft_oversize_strategy == "custom" and ctx.sft_oversize_custom_function_path is None:
        ctx.error(
            "--sft-oversize-strategy custom needs --sft-oversize-custom-function-path",
            "set --sft-oversize-custom-function-path my_pkg.truncate",
        )
    elif ctx.sft_oversize_strategy != "custom" and ctx.sft_oversize_custom_function_path is not None:
        ctx.warn(
            f"--sft-oversize-custom-function-path is ignored with --sft-oversize-strategy "
            f"{ctx.sft_oversize_strategy}",
            "add --sft-oversize-strategy custom",
        )


@rule(
    "rule.sft_max_in_flight_steps",
    "sft-max-in-flight-steps",
    "max-staleness",
    "loss-type",
    summary="--sft-max-in-flight-steps (SFT only) sets --max-staleness = steps - 1 (derived; it overrides a "
    "different explicit --max-staleness, with a warning).",
)
def _in_flight(ctx: RuleContext) -> None:
    steps = ctx.sft_max_in_flight_steps
    if steps is None:
        return
    if not ctx.is_sft:
        ctx.error("--sft-max-in-flight-steps is only used with --loss-type sft", "use --max-staleness for RL")
        return
    if ctx.given("max_staleness") and ctx.max_staleness != steps - 1:
        ctx.warn(
            f"--sft-max-in-flight-steps {steps} sets --max-staleness {steps - 1}, overriding --max-staleness "
            f"{ctx.max_staleness}",
            "set only one of them",
        )
    if ctx.max_staleness != steps - 1:
        ctx.derive("max_staleness", steps - 1)


@rule(
    "rule.sft_async_prepack_requirements",
    "sft-async-prepack",
    "per-rank-fetch",
    "max-staleness",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "qkv-format",
    summary="--sft-async-prepack needs SFT, --per-rank-fetch, two in-flight steps, PP=1, CP=1, VPP=1 and thd.",
    deviation="--sft-async-prepack comes from the reference (its TransferQueue shard section); neither "
    "eb15c45's nor main's argument code defines it, so these are the reference's stated requirements, not "
    "checks of Relax's code.",
)
def _prepack(ctx: RuleContext) -> None:
    if not ctx.sft_async_prepack:
        return
    problems = []
    if not ctx.is_sft:
        problems.append("--loss-type sft")
    if not ctx.per_rank_fetch:
        problems.append("--per-rank-fetch")
    if ctx.max_staleness < 1:
        problems.append("--max-staleness >= 1 (or --sft-max-in-flight-steps >= 2)")
    if ctx.pipeline_model_parallel_size != 1:
        problems.append(f"--pipeline-model-parallel-size 1 (got {ctx.pipeline_model_parallel_size})")
    if ctx.context_parallel_size != 1:
        problems.append(f"--context-parallel-size 1 (got {ctx.context_parallel_size})")
    if ctx.num_layers_per_virtual_pipeline_stage is not None:
        problems.append("no virtual pipeline (--num-layers-per-virtual-pipeline-stage)")
    if ctx.qkv_format != "thd":
        problems.append("--qkv-format thd")
    if problems:
        ctx.error(
            "--sft-async-prepack needs " + "; ".join(problems),
            "fix the listed settings or drop --sft-async-prepack",
        )


@rule(
    "rule.sft_options_need_sft",
    "loss-type",
    "sft-oversize-strategy",
    "sft-prefetch-buffer-size",
    "task-type",
    summary="SFT-only options set without --loss-type sft have no effect (warning).",
)
def _sft_only(ctx: RuleContext) -> None:
    if ctx.is_sft:
        return
    names = (
        "sft_prefetch_buffer_size",
        "sft_prefetch_chunk_size",
        "sft_prefetch_num_workers",
        "sft_oversize_strategy",
        "sft_invalid_multimodal_strategy",
        "task_type",
        "custom_dataset_class_path",
    )
    used = [n for n in names if ctx.non_default(n)]
    if used:
        ctx.warn(
            f"{_flags(*used)} only apply with --loss-type sft",
            "remove them or add --loss-type sft",
            fields=("loss-type", *(FIELDS[n].flag for n in used)),
        )


@rule(
    "rule.max_staleness_colocate",
    "max-staleness",
    "colocate",
    summary="RL in synchronous colocate mode alternates rollout and training on the same GPUs: --max-staleness "
    "> 0 is accepted (as by Relax) but gives no stale rollouts (warning; SFT's in-flight steps are fine).",
)
def _staleness(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.colocate or ctx.hybrid or ctx.max_staleness == 0:
        return
    ctx.warn(
        f"--max-staleness {ctx.max_staleness} with --colocate: rollout and training take turns on the same "
        "GPUs, so rollouts do not run ahead of training",
        "use --hybrid (or --fully-async) for stale rollouts, or remove --max-staleness",
    )


@rule(
    "rule.enable_mtp_training_needs_mtp_num_layers",
    "enable-mtp-training",
    "mtp-num-layers",
    summary="--enable-mtp-training needs --mtp-num-layers.",
)
def _mtp(ctx: RuleContext) -> None:
    if ctx.enable_mtp_training and not ctx.mtp_num_layers:
        ctx.error("--enable-mtp-training needs --mtp-num-layers", "set --mtp-num-layers (e.g. 1)")


@rule(
    "rule.sft_chunked_logits_compatibility",
    "sft-chunked-logits",
    "untie-embeddings-and-output-weights",
    "enable-mtp-training",
    "overlap-moe-expert-parallel-comm",
    summary="--sft-chunked-logits needs untied embeddings (--untie-embeddings-and-output-weights) and cannot be "
    "combined with --enable-mtp-training or --overlap-moe-expert-parallel-comm.",
)
def _chunked_logits(ctx: RuleContext) -> None:
    if not ctx.sft_chunked_logits:
        return
    if not ctx.untie_embeddings_and_output_weights:
        ctx.error(
            "--sft-chunked-logits needs an output layer of its own, but the embeddings are tied "
            "(--untie-embeddings-and-output-weights is not set)",
            "remove --sft-chunked-logits (its memory gain is small on tied-weight models)",
            fields=("sft-chunked-logits", "untie-embeddings-and-output-weights"),
        )
    for name in ("enable_mtp_training", "overlap_moe_expert_parallel_comm"):
        if ctx.values[name]:
            ctx.error(
                f"--sft-chunked-logits cannot be combined with --{FIELDS[name].flag}",
                "remove one of the two",
                fields=("sft-chunked-logits", FIELDS[name].flag),
            )


# =============================================================================================
# Data, rewards, GenRM, rollout services


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
def _prompt_data(ctx: RuleContext) -> None:
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
def _conv_map(ctx: RuleContext) -> None:
    if ctx.conversation_key_map is not None and ctx.label_key is not None:
        ctx.warn(
            "--conversation-key-map is ignored because --label-key is set",
            "remove --label-key when --input-key holds whole message lists",
        )


@rule(
    "rule.prefetch_needs_streaming_dataset",
    "use-streaming-dataset",
    "prefetch-chunk-size",
    "prefetch-max-cached",
    "prefetch-num-workers",
    summary="--prefetch-* options only apply with --use-streaming-dataset (warning).",
)
def _prefetch(ctx: RuleContext) -> None:
    used = [
        n
        for n in ("prefetch_chunk_size", "prefetch_max_cached", "prefetch_num_workers")
        if ctx.non_default(n)
    ]
    if used and not ctx.use_streaming_dataset:
        ctx.warn(
            f"{_flags(*used)} only apply with --use-streaming-dataset (multimodal data)",
            "add --use-streaming-dataset or remove them",
        )


@rule(
    "rule.remote_rm_needs_rm_url",
    "rm-type",
    "rm-url",
    summary="--rm-type remote_rm needs --rm-url.",
    deviation="Relax's start-up checks do not look for --rm-url; the job would fail at its first reward. "
    "The platform refuses it at submission.",
)
def _remote_rm(ctx: RuleContext) -> None:
    if ctx.rm_type == "remote_rm" and ctx.rm_url is None:
        ctx.error("--rm-type remote_rm needs --rm-url", "set --rm-url http://host:port/path")


@rule(
    "rule.genrm_sampling_config_keys",
    "genrm-sampling-config",
    summary="--genrm-sampling-config keys Relax reads: temperature, top_p, top_k, max_response_len and "
    "chat_template_kwargs; other keys are ignored (warning).",
)
def _genrm_keys(ctx: RuleContext) -> None:
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
def _genrm_opts(ctx: RuleContext) -> None:
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
                f"{_flags(*used)} have no effect without --genrm-model-path",
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
def _external(ctx: RuleContext) -> None:
    if ctx.rollout_external and not ctx.rollout_external_engine_addrs:
        ctx.error("--rollout-external needs --rollout-external-engine-addrs", "list the engines' host:port")
    elif ctx.rollout_external_engine_addrs and not ctx.rollout_external:
        ctx.warn(
            "--rollout-external-engine-addrs is ignored without --rollout-external", "add --rollout-external"
        )


@rule(
    "rule.sticky_routing_needs_slime_router",
    "slime-router-sticky",
    "use-slime-router",
    summary="--slime-router-sticky has no effect without --use-slime-router (warning, as Relax's help says).",
)
def _sticky(ctx: RuleContext) -> None:
    if ctx.slime_router_sticky and not ctx.use_slime_router:
        ctx.warn("--slime-router-sticky has no effect without --use-slime-router", "add --use-slime-router")


@rule(
    "rule.slime_router_options",
    "use-slime-router",
    "slime-router-sticky-idle-secs",
    "slime-router-timeout",
    summary="SlimeRouter options need --use-slime-router, and the sticky idle timeout needs sticky routing (warning).",
)
def _router_opts(ctx: RuleContext) -> None:
    names = (
        "slime_router_middleware_paths",
        "slime_router_timeout",
        "slime_router_max_connections",
        "slime_router_health_check_failure_threshold",
    )
    used = [n for n in names if ctx.non_default(n)]
    if used and not ctx.use_slime_router:
        ctx.warn(
            f"{_flags(*used)} only apply with --use-slime-router",
            "add --use-slime-router or remove them",
            fields=("use-slime-router", *(FIELDS[n].flag for n in used)),
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
def _restart(ctx: RuleContext) -> None:
    # On the platform, --use-fault-tolerance makes it the number of times a lost driver is resumed from the
    # job's checkpoint (scheduler/recovery.py).
    if ctx.non_default("max_global_restart") and not (ctx.use_health_check or ctx.use_fault_tolerance):
        ctx.warn(
            "--max-global-restart only applies with --use-health-check or --use-fault-tolerance",
            "add --use-fault-tolerance (the platform resumes a lost driver at most this many times)",
        )


@rule(
    "rule.dump_details_sets_debug_paths",
    "dump-details",
    "save-debug-rollout-data",
    "save-debug-train-data",
    summary="--dump-details DIR sets --save-debug-rollout-data and --save-debug-train-data under DIR (derived).",
)
def _dump(ctx: RuleContext) -> None:
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
def _custom_config(ctx: RuleContext) -> None:
    if ctx.custom_config_path is not None:
        ctx.warn(
            f"--custom-config-path {ctx.custom_config_path!r} overrides parameters when the job starts; those "
            "values are not validated here",
            "put the parameters in the spec itself to have them validated",
        )


# =============================================================================================
# Profiling


@rule(
    "rule.sglang_profile_steps",
    "sglang-profile",
    "sglang-profile-steps",
    "sglang-profile-step-start",
    "sglang-profile-step-end",
    summary="SGLang profile step ranges: start <= end, --sglang-profile-steps overrides them, and they need "
    "--sglang-profile.",
)
def _sglang_profile(ctx: RuleContext) -> None:
    start, end, steps = ctx.sglang_profile_step_start, ctx.sglang_profile_step_end, ctx.sglang_profile_steps
    if start is not None and end is not None and start > end:
        ctx.error(
            f"--sglang-profile-step-start {start} > --sglang-profile-step-end {end} (both inclusive)",
            "use start <= end",
            fields=("sglang-profile-step-start", "sglang-profile-step-end"),
        )
    if steps and (start is not None or end is not None):
        ctx.warn(
            "--sglang-profile-steps overrides --sglang-profile-step-start/--sglang-profile-step-end",
            "keep one way of choosing steps",
            fields=("sglang-profile-steps", "sglang-profile-step-start", "sglang-profile-step-end"),
        )
    if (start is None) != (end is None) and not steps:
        ctx.warn(
            "set both --sglang-profile-step-start and --sglang-profile-step-end for a range",
            "add the missing bound",
            fields=("sglang-profile-step-start", "sglang-profile-step-end"),
        )
    names = (
        "sglang_profile_steps",
        "sglang_profile_step_start",
        "sglang_profile_step_end",
        "sglang_profile_output_dir",
        "sglang_profile_num_steps",
        "sglang_profile_activities",
        "sglang_profile_by_stage",
        "sglang_profile_with_stack",
        "sglang_profile_record_shapes",
    )
    used = [n for n in names if ctx.non_default(n)]
    if used and not ctx.sglang_profile:
        ctx.warn(
            f"{_flags(*used)} only apply with --sglang-profile",
            "add --sglang-profile",
            fields=("sglang-profile", *(FIELDS[n].flag for n in used)),
        )


@rule(
    "rule.profile_step_range",
    "profile-step-start",
    "profile-step-end",
    summary="Training profiling: --profile-step-start <= --profile-step-end (inclusive); options need "
    "--use-pytorch-profiler (warning).",
)
def _profile_range(ctx: RuleContext) -> None:
    if ctx.profile_step_start > ctx.profile_step_end:
        ctx.error(
            f"--profile-step-start {ctx.profile_step_start} > --profile-step-end {ctx.profile_step_end} "
            "(both inclusive)",
            "use start <= end",
        )
    names = (
        "profile_step_start",
        "profile_step_end",
        "profile_target",
        "profile_with_stack",
        "profile_with_memory",
        "profile_with_flops",
    )
    used = [n for n in names if ctx.non_default(n)]
    if used and not ctx.use_pytorch_profiler:
        ctx.warn(
            f"{_flags(*used)} only apply with --use-pytorch-profiler",
            "add --use-pytorch-profiler",
            fields=("use-pytorch-profiler", *(FIELDS[n].flag for n in used)),
        )


@rule(
    "rule.memory_snapshot_needs_history",
    "record-memory-history",
    "memory-snapshot-num-steps",
    "memory-snapshot-dir",
    summary="Memory snapshot options need --record-memory-history (warning).",
)
def _snapshot(ctx: RuleContext) -> None:
    used = [
        n
        for n in ("memory_snapshot_num_steps", "memory_snapshot_dir", "memory_snapshot_path")
        if ctx.non_default(n)
    ]
    if used and not ctx.record_memory_history:
        ctx.warn(
            f"{_flags(*used)} only apply with --record-memory-history",
            "add --record-memory-history",
            fields=("record-memory-history", *(FIELDS[n].flag for n in used)),
        )


# =============================================================================================
# The megatron backend: Relax's own defaults (`_set_default_megatron_args` in
# relax/backends/megatron/arguments.py, run for every job of that backend)


@rule(
    "rule.relax_resets_megatron_defaults",
    "distributed-timeout-minutes",
    "lr",
    "micro-batch-size",
    "mtp-loss-scaling-factor",
    summary="Relax's parser resets some Megatron defaults (--distributed-timeout-minutes 30 instead of 10, "
    "--lr 1e-6, --micro-batch-size 1, ...); on the megatron backend the ones left unset are shown as derived.",
)
def _relax_resets(ctx: RuleContext) -> None:
    if not ctx.megatron:
        return
    for name, value in RELAX_MEGATRON_DEFAULTS[RELAX_MAIN].items():
        if name in FIELDS and not ctx.given(name) and ctx.values[name] == value:
            if MEGATRON[name]["default"] != value:
                ctx.derive(name, value)


@rule(
    "rule.megatron_backend_defaults",
    "use-distributed-optimizer",
    "dist-ckpt-save-pre-mcore-014",
    summary="The megatron backend always uses Megatron's distributed optimizer and saves checkpoints in the "
    "pre-mcore-0.14 layout (derived, as Relax does).",
)
def _megatron_defaults(ctx: RuleContext) -> None:
    if not ctx.megatron:
        return
    for name in ("use_distributed_optimizer", "dist_ckpt_save_pre_mcore_014"):
        if not ctx.values[name]:
            ctx.derive(name, True)


@rule(
    "rule.fp16_and_bf16_exclusive",
    "fp16",
    "bf16",
    summary="Relax trains in bf16 unless --fp16 (bf16 = not fp16; derived on the megatron backend); --bf16 "
    "given with --fp16 is turned off (warning).",
)
def _fp16_bf16(ctx: RuleContext) -> None:
    if ctx.fp16 and ctx.bf16:
        ctx.warn(
            "--fp16 and --bf16 are both set: Relax trains in fp16 and turns --bf16 off (bf16 = not fp16)",
            "keep one precision",
        )
        ctx.derive("bf16", False)
    elif ctx.megatron and not ctx.fp16 and not ctx.bf16:
        ctx.derive("bf16", True)


@rule(
    "rule.bf16_grads_in_fp32",
    "bf16",
    "accumulate-allreduce-grads-in-fp32",
    "grad-reduce-in-bf16",
    "main-grads-dtype",
    summary="Under bf16 Megatron accumulates and all-reduces gradients in fp32 unless --grad-reduce-in-bf16 "
    "(or --main-grads-dtype other than fp32): derived as Megatron's validate_args does.",
)
def _bf16_grads_in_fp32(ctx: RuleContext) -> None:
    values = ctx.values
    if not ctx.megatron_validates or not values["bf16"]:
        return
    if values["grad_reduce_in_bf16"]:
        if values["accumulate_allreduce_grads_in_fp32"]:
            ctx.derive("accumulate_allreduce_grads_in_fp32", False)
    elif not values["accumulate_allreduce_grads_in_fp32"] and values["main_grads_dtype"] in ("fp32", None):
        ctx.derive("accumulate_allreduce_grads_in_fp32", True)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


#: Relax's FP16 compatibility values (`_resolve_optimizer_precision_args`), applied to options left unset.
FP16_FALLBACKS: dict[str, Any] = {
    "initial_loss_scale": 32768.0,
    "min_loss_scale": 1.0,
    "use_precision_aware_optimizer": True,
    "store_param_remainders": False,
}


@rule(
    "rule.fp16_compat_fallbacks",
    "fp16",
    "store-param-remainders",
    "initial-loss-scale",
    "min-loss-scale",
    "use-precision-aware-optimizer",
    summary="On the megatron backend with --fp16, Relax fills FP16 optimizer options left unset with "
    "compatibility values and warns (derived). With Megatron 3714d81's defaults only --store-param-remainders "
    "can be unset (off under FP16); the loss scales and --use-precision-aware-optimizer keep Megatron's "
    "defaults (2**32, 1.0, off), and a static --loss-scale skips the scales.",
)
def _fp16_fallbacks(ctx: RuleContext) -> None:
    if not ctx.megatron or not ctx.fp16:
        return
    applied = []
    for name, value in FP16_FALLBACKS.items():
        if ctx.loss_scale is not None and name in ("initial_loss_scale", "min_loss_scale"):
            continue
        if ctx.values[name] is None:
            ctx.derive(name, value)
            shown = f"--{FIELDS[name].flag}" if value is True else f"--no-{FIELDS[name].flag}"
            applied.append(shown if isinstance(value, bool) else f"--{FIELDS[name].flag} {_fmt(value)}")
    if applied:
        ctx.warn(
            "FP16 optimizer options were not set; Relax uses its compatibility fallbacks: "
            + ", ".join(applied),
            f"pass {', '.join(applied)} explicitly to silence this warning",
            fields=("fp16", *(FIELDS[n].flag for n in FP16_FALLBACKS if n in ctx.derived)),
        )


@rule(
    "rule.fp16_dynamic_loss_scale_valid",
    "initial-loss-scale",
    "min-loss-scale",
    summary="Dynamic FP16 loss scaling (--fp16 without --loss-scale): both scales finite and > 0, and "
    "--min-loss-scale <= --initial-loss-scale.",
)
def _fp16_scales(ctx: RuleContext) -> None:
    if not ctx.fp16 or ctx.loss_scale is not None:
        return
    init, low = ctx.initial_loss_scale, ctx.min_loss_scale
    bad = False
    for name, value in (("initial_loss_scale", init), ("min_loss_scale", low)):
        if not math.isfinite(value) or value <= 0:
            bad = True
            ctx.error(
                f"--{FIELDS[name].flag} {value} must be a finite number > 0 for dynamic loss scaling",
                "use a positive scale",
                fields=(FIELDS[name].flag,),
            )
    if not bad and low > init:
        ctx.error(
            f"--min-loss-scale {_fmt(low)} > --initial-loss-scale {_fmt(init)}",
            "use min_loss_scale <= initial_loss_scale",
        )


@rule(
    "rule.loss_scale_options_need_dynamic_fp16",
    "fp16",
    "loss-scale",
    "initial-loss-scale",
    "min-loss-scale",
    summary="Loss-scale options only apply with --fp16, and the dynamic scales not with a static --loss-scale "
    "(warning).",
)
def _loss_scale_opts(ctx: RuleContext) -> None:
    names = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")
    if not ctx.fp16:
        used = [n for n in names if ctx.non_default(n)]
        if used:
            ctx.warn(
                f"{_flags(*used)} only apply with --fp16",
                "remove them or add --fp16",
                fields=("fp16", *(FIELDS[n].flag for n in used)),
            )
    elif ctx.loss_scale is not None:
        used = [n for n in ("initial_loss_scale", "min_loss_scale") if ctx.non_default(n)]
        if used:
            ctx.warn(
                f"{_flags(*used)} are not used with a static --loss-scale",
                "remove them",
                fields=("loss-scale", *(FIELDS[n].flag for n in used)),
            )


@rule(
    "rule.megatron_sequence_length_placeholders",
    "seq-length",
    "max-position-embeddings",
    summary="On the megatron backend an unset --seq-length is 4096 and --max-position-embeddings is set to "
    "--seq-length (Relax's placeholders: samples have variable length; derived).",
)
def _seq_placeholders(ctx: RuleContext) -> None:
    if not ctx.megatron:
        return
    if ctx.seq_length is None:
        ctx.derive("seq_length", 4096)
    if ctx.max_position_embeddings != ctx.seq_length:
        ctx.derive("max_position_embeddings", ctx.seq_length)


@rule(
    "rule.megatron_rope_type",
    "rope-type",
    "multi-latent-attention",
    summary="On the megatron backend an unset --rope-type is yarn with --multi-latent-attention, else rope "
    "(derived).",
)
def _rope_type(ctx: RuleContext) -> None:
    if ctx.megatron and ctx.rope_type is None:
        ctx.derive("rope_type", "yarn" if ctx.multi_latent_attention else "rope")


@rule(
    "rule.megatron_padded_vocab_size",
    "vocab-size",
    "padded-vocab-size",
    "make-vocab-size-divisible-by",
    "tensor-model-parallel-size",
    summary="On the megatron backend --vocab-size without --padded-vocab-size is padded up to a multiple of "
    "make_vocab_size_divisible_by x TP (derived, as Megatron pads it).",
)
def _padded_vocab(ctx: RuleContext) -> None:
    if not ctx.megatron or not ctx.vocab_size or ctx.padded_vocab_size:
        return
    multiple = ctx.make_vocab_size_divisible_by * ctx.tensor_model_parallel_size
    if multiple > 0:
        ctx.derive("padded_vocab_size", -(-ctx.vocab_size // multiple) * multiple)


@rule(
    "rule.megatron_tokenizer_from_hf_checkpoint",
    "tokenizer-model",
    "tokenizer-type",
    "hf-checkpoint",
    summary="On the megatron backend, with neither --tokenizer-model nor --tokenizer-type, the tokenizer is "
    "--hf-checkpoint's (HuggingFaceTokenizer; derived).",
)
def _tokenizer(ctx: RuleContext) -> None:
    if not ctx.megatron or ctx.tokenizer_model or ctx.tokenizer_type or ctx.hf_checkpoint is None:
        return
    ctx.derive("tokenizer_model", ctx.hf_checkpoint)
    ctx.derive("tokenizer_type", "HuggingFaceTokenizer")


# =============================================================================================
# The megatron backend: Megatron-LM's `validate_args` (3714d81) and Relax's additions to it. Relax
# skips them with --debug-rollout-only; the torch backend refuses these parameters by name.


@rule(
    "rule.megatron_expert_tensor_parallel_default",
    "expert-tensor-parallel-size",
    "tensor-model-parallel-size",
    summary="An unset --expert-tensor-parallel-size is --tensor-model-parallel-size (derived, Megatron).",
)
def _etp(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.expert_tensor_parallel_size is None:
        ctx.derive("expert_tensor_parallel_size", ctx.tensor_model_parallel_size)


@rule(
    "rule.megatron_recompute_activations",
    "recompute-activations",
    "recompute-granularity",
    summary="--recompute-activations means --recompute-granularity selective (derived, Megatron; a different "
    "granularity is overridden with a warning).",
)
def _recompute_activations(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or not ctx.recompute_activations:
        return
    if ctx.recompute_granularity == "full":
        ctx.warn(
            "--recompute-activations sets --recompute-granularity selective, overriding full",
            "remove --recompute-activations to recompute full layers",
            fields=("recompute-activations", "recompute-granularity"),
        )
    if ctx.recompute_granularity != "selective":
        ctx.derive("recompute_granularity", "selective")


@rule(
    "rule.megatron_rotary_position_embeddings",
    "use-rotary-position-embeddings",
    "position-embedding-type",
    summary="--use-rotary-position-embeddings means --position-embedding-type rope (derived, Megatron).",
)
def _rotary(ctx: RuleContext) -> None:
    if (
        ctx.megatron_validates
        and ctx.use_rotary_position_embeddings
        and ctx.position_embedding_type != "rope"
    ):
        ctx.derive("position_embedding_type", "rope")


@rule(
    "rule.moe_token_dispatcher_alltoall",
    "moe-token-dispatcher-type",
    summary="Relax trains on variable-length sequences, which the allgather MoE dispatcher does not support: "
    "allgather (Megatron's default) becomes alltoall (derived; a warning when allgather was given).",
)
def _dispatcher(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or ctx.moe_token_dispatcher_type != "allgather":
        return
    if ctx.given("moe_token_dispatcher_type"):
        ctx.warn(
            "--moe-token-dispatcher-type allgather does not support variable sequence lengths; Relax uses alltoall",
            "write --moe-token-dispatcher-type alltoall (or flex)",
        )
    ctx.derive("moe_token_dispatcher_type", "alltoall")


@rule(
    "rule.sequence_parallel_needs_tp",
    "sequence-parallel",
    "tensor-model-parallel-size",
    summary="--sequence-parallel needs --tensor-model-parallel-size > 1; Megatron turns it off otherwise "
    "(derived, with a warning).",
)
def _sp(ctx: RuleContext) -> None:
    if ctx.sequence_parallel and ctx.tensor_model_parallel_size == 1:
        ctx.warn(
            "--sequence-parallel has no effect with --tensor-model-parallel-size 1 (Megatron disables it)",
            "remove --sequence-parallel or raise TP",
        )
        if ctx.megatron_validates:
            ctx.derive("sequence_parallel", False)


@rule(
    "rule.recompute_options",
    "recompute-granularity",
    "recompute-method",
    "recompute-num-layers",
    summary="Megatron's recompute settings: full needs --recompute-method and --recompute-num-layers, "
    "selective takes neither; without a granularity they are ignored (warning).",
)
def _recompute(ctx: RuleContext) -> None:
    granularity, method, layers = ctx.recompute_granularity, ctx.recompute_method, ctx.recompute_num_layers
    if granularity is None:
        used = [n for n in ("recompute_method", "recompute_num_layers") if ctx.values[n] is not None]
        if used:
            ctx.warn(
                f"{_flags(*used)} have no effect without --recompute-granularity",
                "add --recompute-granularity full",
                fields=("recompute-granularity", *(FIELDS[n].flag for n in used)),
            )
        return
    if granularity == "full":
        missing = [
            n for n, v in (("recompute_method", method), ("recompute_num_layers", layers)) if v is None
        ]
        if missing:
            ctx.error(
                f"--recompute-granularity full needs {_flags(*missing)}",
                "e.g. --recompute-method uniform --recompute-num-layers 1",
                fields=("recompute-granularity", *(FIELDS[n].flag for n in missing)),
            )
        return
    used = [n for n in ("recompute_method", "recompute_num_layers") if ctx.values[n] is not None]
    if used:
        why = " (--recompute-activations selects it)" if ctx.recompute_activations else ""
        ctx.error(
            f"--recompute-granularity selective{why} takes no {_flags(*used)}",
            f"remove {_flags(*used)}, or use --recompute-granularity full",
            fields=("recompute-granularity", *(FIELDS[n].flag for n in used)),
        )


@rule(
    "rule.attention_heads_shape",
    "num-attention-heads",
    "num-query-groups",
    "group-query-attention",
    "tensor-model-parallel-size",
    summary="Model shape vs TP: heads (and, with --group-query-attention, query groups) divisible by TP; "
    "--num-query-groups only applies with --group-query-attention (warnings).",
)
def _heads(ctx: RuleContext) -> None:
    tp = ctx.tensor_model_parallel_size
    if ctx.num_attention_heads is not None and ctx.num_attention_heads % tp:
        ctx.error(
            f"--num-attention-heads {ctx.num_attention_heads} is not divisible by "
            f"--tensor-model-parallel-size {tp}",
            "choose a TP size that divides the head count",
            fields=("num-attention-heads", "tensor-model-parallel-size"),
        )
    if not ctx.group_query_attention:
        if ctx.given("num_query_groups") and ctx.non_default("num_query_groups"):
            ctx.warn(
                f"--num-query-groups {ctx.num_query_groups} is ignored without --group-query-attention",
                "add --group-query-attention",
                fields=("num-query-groups", "group-query-attention"),
            )
        return
    if not ctx.given("num_query_groups"):
        ctx.warn(
            "--group-query-attention without --num-query-groups uses Megatron's default of 1 group "
            "(multi-query attention)",
            "set --num-query-groups to the model's number of key/value heads",
            fields=("group-query-attention", "num-query-groups"),
        )
    if ctx.num_query_groups % tp:
        ctx.error(
            f"--num-query-groups {ctx.num_query_groups} is not divisible by --tensor-model-parallel-size {tp}",
            "choose a TP size that divides the query groups",
            fields=("num-query-groups", "tensor-model-parallel-size"),
        )


@rule(
    "rule.experts_divisible_by_expert_parallel",
    "num-experts",
    "expert-model-parallel-size",
    summary="--expert-model-parallel-size > 1 needs --num-experts, divisible by it (Megatron).",
)
def _experts(ctx: RuleContext) -> None:
    ep = ctx.expert_model_parallel_size
    if ctx.num_experts is not None and ctx.num_experts % ep:
        ctx.error(
            f"--num-experts {ctx.num_experts} is not divisible by --expert-model-parallel-size {ep}",
            "choose an EP size that divides the expert count",
        )
    elif not ctx.num_experts and ep > 1:
        ctx.error(
            f"--expert-model-parallel-size {ep} needs --num-experts (expert parallelism splits a MoE model's "
            "experts)",
            "set --num-experts, or use --expert-model-parallel-size 1 for a dense model",
        )


@rule(
    "rule.megatron_uneven_pipeline_needs_pp",
    "decoder-first-pipeline-num-layers",
    "decoder-last-pipeline-num-layers",
    "pipeline-model-parallel-size",
    summary="--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1 (Relax).",
)
def _uneven_pp(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or ctx.pipeline_model_parallel_size != 1:
        return
    used = [
        n
        for n in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
        if ctx.values[n] is not None
    ]
    if used:
        ctx.error(
            f"{_flags(*used)} shape the first/last pipeline stage, but --pipeline-model-parallel-size is 1",
            f"remove {_flags(*used)}, or raise --pipeline-model-parallel-size",
            fields=(*(FIELDS[n].flag for n in used), "pipeline-model-parallel-size"),
        )


@rule(
    "rule.context_parallel_needs_per_token_loss",
    "context-parallel-size",
    "calculate-per-token-loss",
    summary="--context-parallel-size > 1 needs --calculate-per-token-loss (Relax, for Megatron-Bridge).",
)
def _cp_loss(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.context_parallel_size > 1 and not ctx.calculate_per_token_loss:
        ctx.error(
            f"--context-parallel-size {ctx.context_parallel_size} needs --calculate-per-token-loss",
            "add --calculate-per-token-loss",
        )


@rule(
    "rule.megatron_save_needs_save_interval",
    "save",
    "save-interval",
    summary="On the megatron backend --save needs --save-interval (Megatron's check).",
)
def _save_needs_interval(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.save is not None and ctx.save_interval is None:
        ctx.error(
            "--save is set without --save-interval, which Megatron requires with it",
            "add --save-interval N (rollouts between checkpoints)",
        )


@rule(
    "rule.megatron_min_lr_within_lr",
    "min-lr",
    "lr",
    summary="--min-lr must not exceed --lr (Megatron).",
)
def _min_lr(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.lr is not None and ctx.min_lr > ctx.lr:
        ctx.error(f"--min-lr {ctx.min_lr} > --lr {ctx.lr}", "use min_lr <= lr")


@rule(
    "rule.optimizer_cpu_offload_needs_precision_aware_optimizer",
    "optimizer-cpu-offload",
    "use-precision-aware-optimizer",
    summary="--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron).",
)
def _cpu_offload_precision(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.optimizer_cpu_offload and not ctx.use_precision_aware_optimizer:
        ctx.error(
            "--optimizer-cpu-offload needs --use-precision-aware-optimizer (its hybrid optimizer reuses that path)",
            "add --use-precision-aware-optimizer",
        )


@rule(
    "rule.overlap_param_gather_needs_overlap_grad_reduce",
    "overlap-param-gather",
    "overlap-grad-reduce",
    summary="--overlap-param-gather needs --overlap-grad-reduce (Megatron); the distributed optimizer it also "
    "needs is always on under Relax.",
)
def _overlap(ctx: RuleContext) -> None:
    if ctx.overlap_param_gather and not ctx.overlap_grad_reduce:
        ctx.error("--overlap-param-gather needs --overlap-grad-reduce", "add --overlap-grad-reduce")


@rule(
    "rule.optimizer_overlap_compatibility",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "num-experts",
    "expert-model-parallel-size",
    "multimodal-keys",
    "context-parallel-size",
    summary="The reference's compatibility table marks --overlap-grad-reduce / --overlap-param-gather as "
    "unsupported for MoE models and for vision-language models with CP > 1; Relax's code accepts them "
    "(warning).",
)
def _overlap_table(ctx: RuleContext) -> None:
    used = [n for n in ("overlap_grad_reduce", "overlap_param_gather") if ctx.values[n]]
    if not used:
        return
    moe = ctx.num_experts is not None or ctx.expert_model_parallel_size > 1
    if moe:
        ctx.warn(
            f"{_flags(*used)} are marked unsupported for MoE models in the reference's compatibility table",
            "remove them if training stalls or diverges; --use-distributed-optimizer is fine",
            fields=(*(FIELDS[n].flag for n in used), "num-experts", "expert-model-parallel-size"),
        )
    if ctx.multimodal_keys and ctx.context_parallel_size > 1:
        ctx.warn(
            f"{_flags(*used)} are marked unsupported for vision-language models with --context-parallel-size "
            f"{ctx.context_parallel_size} > 1 in the reference's compatibility table",
            "remove them, or use CP = 1",
            fields=(*(FIELDS[n].flag for n in used), "multimodal-keys", "context-parallel-size"),
        )


@rule(
    "rule.cpu_optimizer_overlap_needs_offload",
    "overlap-cpu-optimizer-d2h-h2d",
    "optimizer-cpu-offload",
    summary="--overlap-cpu-optimizer-d2h-h2d only applies with --optimizer-cpu-offload (warning).",
)
def _cpu_opt(ctx: RuleContext) -> None:
    if ctx.overlap_cpu_optimizer_d2h_h2d and not ctx.optimizer_cpu_offload:
        ctx.warn(
            "--overlap-cpu-optimizer-d2h-h2d only applies with --optimizer-cpu-offload",
            "add --optimizer-cpu-offload",
        )


# =============================================================================================
# Topology (GPU layout); `jobspec.demand` turns a layout that passes these into a ResourceDemand


@rule(
    "rule.pool_node_size",
    "num-gpus-per-node",
    "rollout-num-gpus-per-engine",
    "genrm-num-gpus-per-engine",
    summary="With the pool's node size known (max_gpus_per_node): an unset --num-gpus-per-node takes it "
    "(derived); an explicit larger one, or an engine that cannot sit on such nodes, is an error.",
    deviation="Relax knows no pools: it takes --num-gpus-per-node as given. The platform sizes the job for "
    "the nodes of the pool it will run in, and refuses a layout those nodes cannot hold.",
)
def _pool(ctx: RuleContext) -> None:
    limit = ctx.max_gpus_per_node
    if limit is None:
        return
    if not ctx.given("num_gpus_per_node"):
        if ctx.num_gpus_per_node != limit:
            ctx.derive("num_gpus_per_node", limit)
    elif ctx.num_gpus_per_node > limit:
        ctx.error(
            f"--num-gpus-per-node {ctx.num_gpus_per_node} exceeds this pool's {limit} GPUs per node",
            f"set --num-gpus-per-node {limit} (and size --resource for it)",
            fields=("num-gpus-per-node",),
        )
    for name in ("rollout_num_gpus_per_engine", "genrm_num_gpus_per_engine"):
        size = ctx.values[name]
        if size > limit and size % limit and (name != "genrm_num_gpus_per_engine" or ctx.genrm_model_path):
            ctx.error(
                f"--{FIELDS[name].flag} {size} does not fit on this pool's nodes of {limit} GPUs",
                f"use an engine size <= {limit}",
                fields=(FIELDS[name].flag,),
            )


@rule(
    "rule.resource_roles",
    "resource",
    summary="--resource roles: known names (warning otherwise), at least one replica, GPUs divisible by replicas.",
)
def _resource_roles(ctx: RuleContext) -> None:
    for role, (replicas, gpus) in resource_roles(ctx.values).items():
        if role not in KNOWN_ROLES:
            ctx.warn(
                f"--resource role {role!r} is not one Relax knows ({', '.join(KNOWN_ROLES)})",
                "check the spelling of the role",
            )
        if replicas < 1:
            ctx.error(f"--resource {role!r} has {replicas} replicas", f"use [1, {gpus}]")
        elif gpus % replicas and role not in ("actor", "critic", "rollout", "genrm"):
            ctx.error(
                f"--resource {role!r}: {gpus} GPUs cannot be split evenly over {replicas} replicas",
                "make the GPU count a multiple of the replica count",
            )


@rule(
    "rule.resource_needs_actor_and_rollout",
    "resource",
    "colocate",
    "debug-train-only",
    "debug-rollout-only",
    summary="--resource needs an 'actor' entry (unless rollout-only) and, without --colocate, a 'rollout' entry "
    "or --rollout-num-gpus (unless train-only or external engines); without --resource Relax's legacy default "
    "applies: an actor of --actor-num-nodes 1 x --actor-num-gpus-per-node 8 = 8 GPUs (warning).",
)
def _resource_roles_present(ctx: RuleContext) -> None:
    roles = resource_roles(ctx.values)
    if ctx.resource is None:
        note = legacy_actor_note(ctx.values) if not ctx.debug_rollout_only else None
        ctx.warn(
            f"--resource is not set: {note}" if note else "--resource is not set",
            'set --resource \'{"actor": [1, N], "rollout": [1, M]}\' to size the job',
        )
    elif "actor" not in roles and not ctx.debug_rollout_only:
        ctx.error(
            f"--resource has no 'actor' entry (roles: {', '.join(sorted(roles)) or 'none'})",
            'add "actor": [1, N]',
        )
    if rollout_gpus(ctx.values) is None:
        ctx.error(
            "the rollout engines have no GPUs: without --colocate, --resource needs a 'rollout' entry (or "
            "--rollout-num-gpus)",
            'add "rollout": [1, M] to --resource, or --colocate',
        )


@rule(
    "rule.actor_gpus_divisible_by_model_parallel",
    "resource",
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    summary="The actor's (and critic's) GPUs must be a multiple of TP x PP x CP.",
)
def _actor_mp(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only:
        return
    mp = model_parallel_size(ctx.values)
    for role, gpus in (("actor", actor_gpus(ctx.values)), ("critic", critic_gpus(ctx.values))):
        if role == "critic" and not gpus:
            continue
        if gpus < mp or gpus % mp:
            ctx.error(
                f"the {role} has {gpus} GPUs, not a multiple of TP x PP x CP = {ctx.tensor_model_parallel_size} x "
                f"{ctx.pipeline_model_parallel_size} x {ctx.context_parallel_size} = {mp}",
                f"give the {role} a multiple of {mp} GPUs in --resource, or change the parallel sizes",
            )


@rule(
    "rule.expert_parallel_fits_actor",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "resource",
    summary="The actor's GPUs per pipeline stage must be divisible by EP x ETP (Megatron).",
)
def _ep_fits(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only:
        return
    per_stage = actor_gpus(ctx.values) // ctx.pipeline_model_parallel_size
    group = ctx.expert_model_parallel_size * (
        ctx.expert_tensor_parallel_size or ctx.tensor_model_parallel_size
    )
    if group > 1 and per_stage % group:
        ctx.error(
            f"{per_stage} actor GPUs per pipeline stage are not divisible by EP x ETP = "
            f"{ctx.expert_model_parallel_size} x {ctx.expert_tensor_parallel_size} = {group}",
            "choose expert parallel sizes that divide the GPUs of a pipeline stage",
        )


@rule(
    "rule.actor_whole_nodes",
    "resource",
    "num-gpus-per-node",
    summary="An actor (or critic) larger than a node must use whole nodes (Relax derives nodes by integer division).",
    deviation="Relax derives --actor-num-nodes by integer division, so an actor of 12 GPUs on nodes of 8 "
    "would train on 8; the platform refuses GPUs the job would be given and not use.",
)
def _whole_nodes(ctx: RuleContext) -> None:
    node = ctx.num_gpus_per_node
    for role, gpus in (("actor", actor_gpus(ctx.values)), ("critic", critic_gpus(ctx.values))):
        if gpus > node and gpus % node:
            ctx.error(
                f"the {role} has {gpus} GPUs, more than one node of {node} but not a whole number of nodes",
                f"use a multiple of {node} GPUs for the {role}, or set --num-gpus-per-node",
            )


@rule(
    "rule.tensor_parallel_within_node",
    "tensor-model-parallel-size",
    "num-gpus-per-node",
    summary="A tensor-parallel group larger than a node spans nodes (slow; warning).",
)
def _tp_node(ctx: RuleContext) -> None:
    if ctx.tensor_model_parallel_size > ctx.num_gpus_per_node:
        ctx.warn(
            f"--tensor-model-parallel-size {ctx.tensor_model_parallel_size} exceeds a node of "
            f"{ctx.num_gpus_per_node} GPUs; tensor parallelism across nodes is slow",
            "keep TP within a node and use PP across nodes",
        )


@rule(
    "rule.rollout_engines_fit",
    "rollout-num-gpus-per-engine",
    "resource",
    "num-gpus-per-node",
    summary="Rollout GPUs must be a multiple of --rollout-num-gpus-per-engine, and an engine larger than a node "
    "must span whole nodes.",
    deviation="Relax starts rollout_num_gpus // rollout_num_gpus_per_engine engines and leaves the remainder "
    "idle; the platform refuses GPUs the job would be given and not use.",
)
def _engines(ctx: RuleContext) -> None:
    total = rollout_gpus(ctx.values)
    per, node = ctx.rollout_num_gpus_per_engine, ctx.num_gpus_per_node
    if total:
        if total % per:
            ctx.error(
                f"{total} rollout GPUs cannot be split into engines of --rollout-num-gpus-per-engine {per}",
                f"make the rollout GPU count a multiple of {per}",
            )
    if total and per > node and per % node:
        ctx.error(
            f"a rollout engine of {per} GPUs is larger than a node of {node} and not a whole number of nodes",
            f"use an engine size <= {node} or a multiple of {node}",
            fields=("rollout-num-gpus-per-engine", "num-gpus-per-node"),
        )


@rule(
    "rule.colocate_rollout_spans_actor",
    "colocate",
    "resource",
    summary="In colocate mode the rollout engines span the actor (and critic) GPUs; a different 'rollout' entry "
    "is overridden (warning).",
)
def _colocate_rollout(ctx: RuleContext) -> None:
    roles = resource_roles(ctx.values)
    if (
        not ctx.colocate
        or ctx.hybrid
        or ctx.genrm_model_path
        or managed_teacher(ctx.values)
        or "rollout" not in roles
    ):
        return
    expected = actor_gpus(ctx.values) + critic_gpus(ctx.values)
    if roles["rollout"][1] != expected:
        ctx.warn(
            f"--resource rollout has {roles['rollout'][1]} GPUs, but colocated rollout spans the "
            f"{expected} actor{'+critic' if critic_gpus(ctx.values) else ''} GPUs (Relax overrides it)",
            f'write "rollout": [1, {expected}]',
        )


@rule(
    "rule.genrm_layout",
    "genrm-num-gpus",
    "genrm-num-gpus-per-engine",
    "colocate",
    "resource",
    summary="GenRM GPUs divide into engines; colocated GenRM either splits the actor GPUs with rollout "
    "(rollout + genrm == actor) or shares them (rollout == genrm == actor).",
)
def _genrm(ctx: RuleContext) -> None:
    genrm = genrm_gpus(ctx.values)
    if not genrm:
        return
    if genrm % ctx.genrm_num_gpus_per_engine:
        ctx.error(
            f"{genrm} GenRM GPUs cannot be split into engines of --genrm-num-gpus-per-engine "
            f"{ctx.genrm_num_gpus_per_engine}",
            "make the GenRM GPU count a multiple of the engine size",
        )
    if ctx.colocate and not ctx.hybrid:
        actor = actor_gpus(ctx.values) + critic_gpus(ctx.values)
        rollout = rollout_gpus(ctx.values)
        if rollout is None:
            return  # reported by rule.resource_needs_actor_and_rollout
        if not (rollout + genrm == actor or rollout == genrm == actor):
            ctx.error(
                f"colocated GenRM needs rollout + genrm == actor ({rollout} + {genrm} != {actor}) or "
                f"rollout == genrm == actor ({actor})",
                f'e.g. "rollout": [1, {actor - genrm}] with --genrm-num-gpus {genrm}',
            )


@rule(
    "rule.opd_managed_teacher_colocate_layout",
    "resource",
    "colocate",
    "teacher-hf-checkpoint",
    "opd-teacher-routes",
    summary="A Relax-managed OPD teacher in colocate mode lives inside the actor's GPUs after the rollout engines: "
    "rollout GPUs + the 'teacher' entry's GPUs must equal the actor's (and critic's) GPUs.",
)
def _managed_teacher_layout(ctx: RuleContext) -> None:
    if not ctx.colocate or ctx.hybrid or not managed_teacher(ctx.values):
        return
    roles = resource_roles(ctx.values)
    rollout = rollout_gpus(ctx.values)
    if rollout is None:
        return  # reported by rule.resource_needs_actor_and_rollout
    actor = actor_gpus(ctx.values) + critic_gpus(ctx.values)
    teacher = roles["teacher"][1]
    if rollout + teacher != actor:
        ctx.error(
            f"a managed OPD teacher in colocate mode splits the actor's GPUs with rollout: rollout + teacher must "
            f"be {actor}, got {rollout} + {teacher}",
            f'e.g. "rollout": [1, {max(actor - teacher, 0)}] with "teacher": [1, {teacher}]',
        )


@rule(
    "rule.global_batch_size_divisible_by_micro_batches",
    "global-batch-size",
    "micro-batch-size",
    "resource",
    summary="Static batching: --global-batch-size must be a multiple of micro_batch_size x data-parallel size.",
)
def _gbs_dp(ctx: RuleContext) -> None:
    if ctx.use_dynamic_batch_size or ctx.global_batch_size is None or ctx.debug_rollout_only:
        return
    mp = model_parallel_size(ctx.values)
    gpus = actor_gpus(ctx.values)
    if gpus < mp or gpus % mp:
        return  # reported by rule.actor_gpus_divisible_by_model_parallel
    dp = gpus // mp
    unit = ctx.micro_batch_size * dp
    if ctx.global_batch_size % unit:
        ctx.error(
            f"--global-batch-size {ctx.global_batch_size} is not a multiple of micro_batch_size x data-parallel size "
            f"= {ctx.micro_batch_size} x {dp} = {unit}",
            f"use a global batch size that is a multiple of {unit}, or --use-dynamic-batch-size",
        )
