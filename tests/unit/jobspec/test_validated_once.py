"""`normalize` validates only the fields given (`jobspec.intake.validate_spec`, the rest taken from the defaults'
spec), and then only the fields the rules derived (`jobspec.normalization._with_derived`): the spec, its errors
and their messages are those of validating every field, as it did before."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

import jobspec
import jobspec.normalization as normalization
from jobspec import JobSpec, SpecError
from jobspec.bounds import INT_MAX
from tests.factories import grpo_spec
from tests.unit.jobspec.test_roundtrip import _validated_whole

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


def _validated_twice(checked: JobSpec, values: dict[str, Any], derived: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(values, strict=True)


def _outcome(**given: Any) -> Any:
    try:
        n = jobspec.normalize(**given)
    except SpecError as err:
        return "error", [i.to_dict() for i in err.issues]
    return n.spec, n.spec.__dict__, sorted(n.spec.model_fields_set), n.to_dict(), n.spec.to_argv()


def _cases() -> list[dict[str, Any]]:
    rng = random.Random(3)
    cases: list[dict[str, Any]] = []
    for path in EXAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        cases.append({"obj": spec})
        cases.append({"obj": spec, "max_gpus_per_node": 8})
        cases.append({"argv": jobspec.normalize(obj=spec).spec.to_argv()})
        for _ in range(3):  # a few values varied: more rules fire
            varied = dict(spec)
            varied["lr"] = rng.choice([1e-4, 1e-3, 3])
            varied["colocate"] = rng.random() < 0.5
            varied["train-backend"] = rng.choice(["megatron", "torch"])
            varied["tensor-model-parallel-size"] = rng.choice([1, 2, 4])
            cases.append({"obj": varied, "max_gpus_per_node": rng.choice([None, 4, 8])})
    cases.append({"obj": grpo_spec(**{"loss-type": "sft", "use-dynamic-batch-size": True})})
    cases.append({"obj": grpo_spec(**{"debug-rollout-only": True, "colocate": True})})
    # a derived value beyond its range (the second validation's own error)
    cases.append(
        {
            "obj": grpo_spec(
                **{"vocab-size": INT_MAX, "make-vocab-size-divisible-by": 2**20, "train-backend": "megatron"}
            )
        }
    )
    cases.append({"obj": grpo_spec(**{"rollout-batch-size": "eight", "kl-coef": 0.1, "kl-loss-coef": 0.1})})
    return cases


@pytest.mark.parametrize("given", _cases())
def test_the_spec_is_the_one_every_field_validated_again_gives(
    given: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    once = _outcome(**given)
    monkeypatch.setattr(normalization, "_with_derived", _validated_twice)
    twice = _outcome(**given)
    assert once == twice
    if once[0] != "error":
        spec, values = once[0], once[1]
        assert {k: type(v) for k, v in values.items()} == {k: type(v) for k, v in twice[1].items()}
        assert spec.model_dump() == values  # JSON values only


@pytest.mark.parametrize("given", _cases())
def test_the_spec_is_the_one_validating_every_given_field_with_the_model_gives(
    given: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`validate_spec` validates only the given values (the rest is the defaults' spec): `normalize` gives the
    spec, the issues and their messages of the model validating all ~1,060 fields."""
    fast = _outcome(**given)
    monkeypatch.setattr(normalization, "validate_spec", _validated_whole)
    monkeypatch.setattr(normalization, "_with_derived", _validated_twice)
    assert fast == _outcome(**given)
