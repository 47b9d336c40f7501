"""Every value of a job spec has a range the schema states, and a spec's size is bounded (jobspec/bounds.py).

Issue 11 item 4: `rollout-batch-size 1e100` was accepted (its driver grew to 2.5 GB), a 1,000-deep JSON
`--resource` failed with RecursionError, and 120,000 unknown keys took 71 s to judge."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobspec import SpecError, normalize
from jobspec.bounds import (
    BYTES_MAX,
    FLOAT_MAX,
    INT_MAX,
    MAX_ARGV_WORDS,
    MAX_DEMAND_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_PATH_LENGTH,
    MAX_SPEC_KEYS,
    MAX_SUGGESTIONS,
    MAX_WORD_LENGTH,
    json_too_deep,
)
from jobspec.spec import FIELDS, JobSpec
from tests.factories import grpo_spec


def _errors(**kw: Any) -> list[tuple[str, str | None]]:
    with pytest.raises(SpecError) as err:
        normalize(**kw)
    return [(i.code, i.field) for i in err.value.errors]


def _number_schemas(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The integer/number schemas of a property (inside anyOf and array items)."""
    out = []
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "array":
            option = option.get("items", {})
        if option.get("type") in ("integer", "number") and "enum" not in option:
            out.append(option)
    return out


def test_every_number_of_the_schema_states_its_range() -> None:
    schema = JobSpec.model_json_schema()
    unbounded = [
        name
        for name, prop in schema["properties"].items()
        for number in _number_schemas(prop)
        if not (
            ("minimum" in number or "exclusiveMinimum" in number)
            and ("maximum" in number or "exclusiveMaximum" in number)
        )
    ]
    assert not unbounded, unbounded
    # and every string its length (paths: PATH_MAX)
    strings = [
        (name, option)
        for name, prop in schema["properties"].items()
        for option in prop.get("anyOf", [prop])
        if option.get("type") == "string" and "enum" not in option and "const" not in option
    ]
    assert strings and all("maxLength" in option for _, option in strings), strings
    assert FIELDS["hf_checkpoint"].max_length == MAX_PATH_LENGTH


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("rollout_batch_size", 1, INT_MAX),  # declared >= 1; the upper end by kind
        ("train_iters", 0, INT_MAX),  # a count: non-negative
        ("rollout_top_k", -1, INT_MAX),  # declared -1 (disabled) as the lower end
        ("fetch_trajectory_retry_times", -1, INT_MAX),  # default -1: the sentinel is the lower end
        ("update_weight_buffer_size", 1, BYTES_MAX),  # a byte size
        ("num_gpus_per_node", 1, MAX_GPUS_PER_NODE),
        ("actor_num_nodes", 0, MAX_DEMAND_GPUS),
        ("router_prometheus_port", 0, 65535),
        ("lr", 0, FLOAT_MAX),
        ("rollout_stop_token_ids", 0, INT_MAX),  # of each item
    ],
)
def test_ranges_come_from_the_kind_of_number(name: str, low: float, high: float) -> None:
    f = FIELDS[name]
    assert (f.ge, f.le) == (low, high)
    assert f"<= {high:.0f}" in f.expected()


def test_rollout_batch_size_1e100_is_refused() -> None:
    """As a JSON integer, a JSON float and a flag: refused, naming the flag, with the range as hint."""
    huge = 10**100
    with pytest.raises(SpecError) as err:
        normalize(obj=grpo_spec(**{"rollout-batch-size": huge}))
    (issue,) = err.value.errors
    assert (issue.code, issue.field) == ("spec.out_of_range", "rollout-batch-size")
    assert f"<= {INT_MAX}" in issue.hint and "101 digits" in issue.message
    assert _errors(obj=grpo_spec(**{"rollout-batch-size": 1e100})) == [
        ("spec.invalid_type", "rollout-batch-size")
    ]
    args = ["--rollout-batch-size", str(huge)]
    assert ("spec.out_of_range", "rollout-batch-size") in _errors(argv=args)
    assert ("spec.invalid_type", "rollout-batch-size") in _errors(argv=["--rollout-batch-size", "1e100"])


def test_gpu_counts_beyond_any_node_or_cluster_are_refused() -> None:
    errors = _errors(obj=grpo_spec(resource={"actor": [1, MAX_DEMAND_GPUS + 1], "rollout": [1, 1]}))
    assert errors == [("spec.out_of_range", "resource")]
    errors = _errors(obj=grpo_spec(**{"num-gpus-per-node": MAX_GPUS_PER_NODE + 1}))
    assert errors == [("spec.out_of_range", "num-gpus-per-node")]


def test_a_derived_value_beyond_its_range_is_an_issue() -> None:
    """Relax pads the vocabulary to a multiple of the tensor-parallel size: a rule's result is judged too."""
    spec = grpo_spec(
        **{"vocab-size": INT_MAX, "make-vocab-size-divisible-by": 2**20, "train-backend": "megatron"}
    )
    errors = _errors(obj=spec)
    assert ("spec.out_of_range", "padded-vocab-size") in errors, errors


def test_deep_json_is_refused_without_recursing() -> None:
    deep = "[" * 1000 + "]" * 1000
    errors = _errors(argv=["--resource", '{"actor": ' + deep + "}"])
    assert ("spec.invalid_json", "resource") in errors
    nested: Any = 1
    for _ in range(1000):
        nested = [nested]
    assert ("spec.out_of_range", "apply-chat-template-kwargs") in _errors(
        obj=grpo_spec(**{"apply-chat-template-kwargs": {"x": nested}})
    )
    assert json_too_deep(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') is False  # inside a string
    assert json_too_deep("[" * 33 + "]" * 33) and not json_too_deep("[" * 32 + "]" * 32)


def test_untyped_numbers_and_strings_are_bounded() -> None:
    """The SGLang passthrough: each flag judged on its own, named in the issue."""
    errors = _errors(obj=grpo_spec(**{"sglang-max-running-requests": 2**63, "sglang-x": "a" * 40_000}))
    assert set(errors) == {
        ("spec.out_of_range", "sglang-max-running-requests"),
        ("spec.out_of_range", "sglang-x"),
    }
    assert ("spec.invalid_type", "sglang-x") not in _errors(
        argv=["--sglang-x", "9" * 5000, "--sglang-y", "-"]
    )


def test_long_strings_are_refused_with_their_limit() -> None:
    with pytest.raises(SpecError) as err:
        normalize(obj=grpo_spec(**{"prompt-data": "artifacts://" + "a" * 100_000}))
    (issue,) = err.value.errors
    assert (issue.code, issue.field) == ("spec.bad_path", "prompt-data")  # as the path resolver says
    assert str(MAX_PATH_LENGTH) in issue.message and len(issue.message) < 300
    # any other string: one command-line word
    assert _errors(obj=grpo_spec(**{"input-key": "k" * (MAX_WORD_LENGTH + 1)})) == [
        ("spec.too_long", "input-key")
    ]


def test_a_spec_over_the_size_limits_is_not_judged() -> None:
    assert _errors(obj={f"k{i}": 1 for i in range(MAX_SPEC_KEYS + 1)}) == [("spec.too_many_keys", None)]
    assert _errors(obj={"sglang": {f"k{i}": 1 for i in range(MAX_SPEC_KEYS + 1)}}) == [
        ("spec.too_many_keys", "sglang-*")
    ]
    assert _errors(argv=["--x"] * (MAX_ARGV_WORDS + 1)) == [("argv.too_long", None)]


def test_only_the_first_unknown_keys_get_a_did_you_mean() -> None:
    """A did-you-mean searches every flag; a spec of unknown keys costs at most MAX_SUGGESTIONS searches."""
    spec = {f"rollout-batch-size-{i}": 1 for i in range(MAX_SPEC_KEYS - 1)}
    start = time.monotonic()
    with pytest.raises(SpecError) as err:
        normalize(obj=spec)
    elapsed = time.monotonic() - start
    unknown = [i for i in err.value.errors if i.code == "spec.unknown_key"]
    assert len(unknown) == MAX_SPEC_KEYS - 1
    assert sum("did you mean" in i.hint for i in unknown) == MAX_SUGGESTIONS
    assert elapsed < 10, elapsed  # ~0.3 s; each search is ~10 ms, all of them ~20 s
