"""Which Relax parameters the torch backend + built-in rollout honour; anything else set is refused by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runtime.spec import RuntimeSpec

# The `resource` roles the torch backend runs (runtime.roles.placement.Role; kept apart so the API
# process importing this module does not import Ray).
RESOURCE_ROLES = frozenset({"actor", "rollout", "reference", "actor_fwd", "critic", "advantages"})

# rm-type names `runtime.rewards` scores (each also as `boxed_<name>`); kept equal to
# `runtime.rewards.known_rm_types()` by a test (imported here, they would pull the reward code into the API).
RM_TYPES = frozenset(
    {
        "dapo",
        "deepscaler",
        "dummy",
        "exact_match",
        "f1",
        "geo3k",
        "gpqa",
        "gsm8k",
        "math",
        "mopd",
        "multiple_choice",
        "openr1mm",
        "random",
        "remote_rm",
    }
)

# Every parameter the runtime reads (RuntimeSpec's fields) is honoured by the torch backend...
TORCH_BACKEND_PARAMETERS: frozenset[str] = RuntimeSpec.field_names() | {
    # ...plus parameters that need nothing more from this backend, many of them set by Relax's derived
    # defaults in every normalized spec.
    "offload_train",  # colocate implies offload; colocated roles offload/onload explicitly
    "offload_rollout",
    "num_gpus_per_node",  # placement is per slot here
    "rollout_num_gpus_per_engine",  # restricted below: the torch engine uses one device
    "checkpoint_engine_backend",  # the runtime picks the weight sync backend (object store on CPU)
    "distributed_backend",
    "distributed_timeout_minutes",
    "optimizer",
    "log_probs_max_tokens_per_gpu",  # log-probs are computed in fixed chunks; any budget is fine
    "balance_data",  # one data-parallel rank: nothing to balance
    "dump_details",  # Relax derives save-debug-rollout-data and save-debug-train-data under it
    "train_memory_margin_bytes",  # restricted below
    "sglang",  # SGLang passthrough arguments do not apply to the built-in engine
    # read by `runtime.rewards.RewardModel.from_spec` from the spec's values
    "rm_url",
    "group_rm",
    "reward_key",
    "eval_reward_key",
    "reward_max_concurrency",
    "reward_num_workers",  # Relax's sync-reward actors; rewards run in the rollout's process here
    "rollout_global_dataset",  # restricted below: Relax turns it off for SFT, which reads --prompt-data itself
}


def _one_of(*allowed: Any) -> Callable[[Any, Mapping[str, Any]], bool]:
    return lambda value, _values: value is None or value in allowed


def _resource_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """Roles this backend runs; the trainer (and each forward-only role, and the critic) on one device."""
    if not value:
        return True
    if not isinstance(value, Mapping) or not set(value) <= RESOURCE_ROLES:
        return False
    devices = {
        role: pair[1] for role, pair in value.items() if isinstance(pair, list | tuple) and len(pair) == 2
    }
    if not values.get("debug_rollout_only") and devices.get("actor", 1) != 1:
        return False
    return all(devices.get(role, 1) <= 1 for role in ("reference", "actor_fwd", "critic"))


def _rm_type_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """A type the reward stage scores; an unknown one only with `rm-type-fallback` (which then scores)."""
    if value is None or values.get("custom_rm_path"):
        return True
    base = str(value).strip().removeprefix("boxed_")
    return base in RM_TYPES or (base not in UNSUPPORTED_RM_TYPES and bool(values.get("rm_type_fallback")))


# Relax rm-types with no implementation here (runtime.rewards.UNSUPPORTED_RM_TYPES says why)
UNSUPPORTED_RM_TYPES = frozenset({"ifbench", "dapo-genrm"})


# Honoured parameters whose value still matters: name -> does this backend implement the value?
RESTRICTIONS: dict[str, Callable[[Any, Mapping[str, Any]], bool]] = {
    "train_backend": _one_of("torch"),
    "rollout_num_gpus_per_engine": _one_of(1),
    "optimizer": _one_of("adam"),
    "loss_type": _one_of("policy_loss", "custom_loss", "sft", "sft_loss"),
    "kl_loss_type": _one_of("k1", "k2", "k3", "low_var_kl"),
    "lr_decay_style": _one_of("constant", "linear", "cosine"),
    "resource": _resource_ok,
    "rm_type": _rm_type_ok,
    "rm_type_fallback": lambda value, _values: (
        value is None or str(value).removeprefix("boxed_") in RM_TYPES | {"zero"}
    ),
    # the built-in engine's server and SGLang itself, over SGLang's HTTP API; `rollout-external` only
    # with the servers' addresses
    "rollout_external": lambda value, values: not value or bool(values.get("rollout_external_engine_addrs")),
    # this backend's PPO takes the rollout log-probs as the old-policy log-probs
    "advantage_estimator": lambda value, values: value != "ppo" or bool(values.get("use_rollout_logprobs")),
    "num_iters_per_train_update": _one_of(1),
    "max_staleness": lambda value, values: not value or bool(values.get("fully_async")),
    "eval_config": lambda value, values: value is None or values.get("loss_type") not in ("sft", "sft_loss"),
    "debug_train_only": lambda value, values: not value or bool(values.get("load_debug_rollout_data")),
    # no trainer memory is reserved; debug-rollout-only derives 0 (there is no trainer at all)
    "train_memory_margin_bytes": lambda value, values: (
        value in (None, 1 << 30) or bool(values.get("debug_rollout_only"))
    ),
    # on; off only where Relax turns it off itself (SFT)
    "rollout_global_dataset": lambda value, values: (
        value is not False or values.get("loss_type") in ("sft", "sft_loss")
    ),
}


#: What a refused value needs instead, where "use a value the backend implements" would not say it.
RESTRICTION_HINTS: dict[str, str] = {
    "advantage_estimator": "the torch backend's PPO takes the rollout log-probs as the old-policy log-probs: "
    "add --use-rollout-logprobs",
}


def unsupported_parameters(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Parameters the torch backend cannot honour: names set away from their default that it does not
    implement, and 'name=value' for honoured names set to a value it does not implement."""
    problems = []
    for name, value in values.items():
        if name in TORCH_BACKEND_PARAMETERS:
            check = RESTRICTIONS.get(name)
            if check is not None and not check(value, values):
                problems.append(f"{name}={value!r}")
        elif name in defaults and value is not None and value != defaults[name]:
            problems.append(name)
    return sorted(problems)


def render_markdown() -> str:
    """The capability table of docs/reference/capabilities.md: every Relax parameter x backend."""
    from jobspec.spec import FIELDS

    lines = [
        "# Backend capabilities",
        "",
        "Generated by `python -m runtime.capabilities > docs/reference/capabilities.md`; do not edit.",
        "A job that sets a parameter its backend does not implement (away from the default) is refused at",
        "submission with the parameter's name (`spec.unsupported_by_backend`).",
        "",
        "- **yes**: honoured · **values**: honoured for the listed values only · **no**: refused when set",
        "- `megatron` (Relax's default backend) is not available on this platform yet: it is refused as a whole.",
        "",
        "| parameter | torch | megatron |",
        "|---|---|---|",
    ]
    for name in sorted(FIELDS):
        flag = "--" + name.replace("_", "-")
        if name in RESTRICTIONS:
            cell = "values"
            doc = RESTRICTION_DOCS.get(name)
            if doc:
                cell += f": {doc}"
        elif name in TORCH_BACKEND_PARAMETERS:
            cell = "yes"
        else:
            cell = "no"
        lines.append(f"| `{flag}` | {cell} | no |")
    return "\n".join(lines) + "\n"


# How each restricted parameter is restricted, for the table.
RESTRICTION_DOCS: dict[str, str] = {
    "train_backend": "torch",
    "advantage_estimator": "every estimator; ppo with --use-rollout-logprobs",
    "rollout_num_gpus_per_engine": "1",
    "optimizer": "adam",
    "loss_type": "policy_loss, custom_loss, sft",
    "kl_loss_type": "k1, k2, k3, low_var_kl",
    "lr_decay_style": "constant, linear, cosine",
    "resource": "roles actor, rollout, reference, actor_fwd, critic, advantages; actor, reference, actor_fwd "
    "and critic on one device",
    "rm_type": "the rm-types of runtime/rewards (ifbench and dapo-genrm are not); any with --rm-type-fallback",
    "rm_type_fallback": "zero, or an rm-type of runtime/rewards",
    "rollout_external": "with --rollout-external-engine-addrs",
    "num_iters_per_train_update": "1",
    "max_staleness": "0 unless --fully-async",
    "eval_config": "RL jobs (SFT takes --eval-prompt-data or --eval-size)",
    "debug_train_only": "with --load-debug-rollout-data",
    "train_memory_margin_bytes": "the default, or 0 as --debug-rollout-only derives it",
    "rollout_global_dataset": "on; off under --loss-type sft (Relax turns it off there)",
}


if __name__ == "__main__":
    print(render_markdown(), end="")
