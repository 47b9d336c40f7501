"""Which Relax parameters the torch backend + built-in rollout honour; anything else set is refused by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runtime.spec import RuntimeSpec

RELAX_ROLLOUT_FUNCTION = "relax.engine.rollout.sglang_rollout.generate_rollout"  # resolves to ours
RELAX_DATA_SOURCE = "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer"

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
    "rollout_function_path",  # restricted below to Relax's default, which is this runtime's generate_rollout
    "eval_function_path",
    "data_source_path",
    "optimizer",
    "over_sampling_batch_size",  # restricted below: no over-sampling
    "log_probs_max_tokens_per_gpu",  # log-probs are computed in fixed chunks; any budget is fine
    "balance_data",  # one data-parallel rank: nothing to balance
    "disable_compute_advantages_and_returns",  # SFT computes none anyway
    "sglang",  # SGLang passthrough arguments do not apply to the built-in engine
}


def _one_of(*allowed: Any) -> Callable[[Any, Mapping[str, Any]], bool]:
    return lambda value, _values: value is None or value in allowed


# Honoured parameters whose value still matters: name -> does this backend implement the value?
RESTRICTIONS: dict[str, Callable[[Any, Mapping[str, Any]], bool]] = {
    "train_backend": _one_of("torch"),
    "rollout_num_gpus_per_engine": _one_of(1),
    "optimizer": _one_of("adam"),
    "rollout_function_path": _one_of(RELAX_ROLLOUT_FUNCTION),
    "eval_function_path": _one_of(RELAX_ROLLOUT_FUNCTION),
    "data_source_path": _one_of(RELAX_DATA_SOURCE),
    "advantage_estimator": _one_of("grpo"),
    "loss_type": _one_of("policy_loss", "sft", "sft_loss"),
    "kl_loss_type": _one_of("k1", "k2", "k3", "low_var_kl"),
    "lr_decay_style": _one_of("constant", "linear", "cosine"),
    "over_sampling_batch_size": lambda value, values: (
        value is None or value == values.get("rollout_batch_size")
    ),
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
