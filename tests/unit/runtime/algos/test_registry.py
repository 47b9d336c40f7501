"""The registries: contents keyed by Relax's names, duplicates refused, misses listing valid names."""

from __future__ import annotations

import pytest

from runtime.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimator
from runtime.algos.kl import KL_ESTIMATORS
from runtime.algos.losses import LOSS_TYPES
from runtime.algos.off_policy import TIS_FUNCTIONS
from runtime.algos.reducers import LOSS_REDUCERS
from runtime.algos.surrogates import POLICY_SURROGATES
from runtime.registry import Registry, UnknownNameError

# Relax's `--advantage-estimator` values (configuration.zh.txt: ALGORITHM_SPECS)
RELAX_ESTIMATORS = [
    "cispo",
    "grpo",
    "gspo",
    "ppo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
    "sapo",
]


def test_registry_contents() -> None:
    assert ADVANTAGE_ESTIMATORS.names() == RELAX_ESTIMATORS == sorted(str(e) for e in AdvantageEstimator)
    assert POLICY_SURROGATES.names() == ["cispo", "gspo", "ppo_clip", "reinforce", "sapo"]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "low_var_kl"]
    assert LOSS_TYPES.names() == ["policy_loss", "sft", "sft_loss", "value_loss"]
    assert LOSS_REDUCERS.names() == ["per_token", "sum_of_sample_mean", "sum_of_sample_sum"]
    assert TIS_FUNCTIONS.names() == ["icepop", "vanilla_tis"]


def test_registry_refuses_duplicates_and_lists_names_on_a_miss() -> None:
    reg: Registry = Registry("widget")
    reg.register("a")(object())
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(object())
    with pytest.raises(UnknownNameError, match="valid names: a"):
        reg.get("b")
    with pytest.raises(UnknownNameError, match="grpo"):
        ADVANTAGE_ESTIMATORS.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGE_ESTIMATORS.register("grpo")(lambda inputs, config: None)
