"""Property: over the whole schema, normalize(argv=spec.to_argv()) and normalize(obj=spec.to_dict()) give spec back.

Strategies are generated from the field registry, so a new field is covered without touching this file.
A random spec usually breaks some cross-field rule; `_repair` resets the fields an error names (to the
base value, or to the default) until the spec is valid, so every field keeps random values in most
examples while every example that reaches the assertions is a valid spec.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobspec import FIELDS, JobSpec, SpecError, normalize
from jobspec.argv import parse_passthrough_scalar
from jobspec.demand import KNOWN_ROLES
from jobspec.intake import default_spec, issues_from_validation, validate_spec
from jobspec.spec import FieldSpec

BASE: dict[str, Any] = {
    "hf_checkpoint": "/models/qwen",
    "prompt_data": "/data/train.jsonl",
    "rollout_batch_size": 8,
    "num_rollout": 4,
    "colocate": True,
    "resource": {"actor": [1, 2], "rollout": [1, 2]},
}
BY_FLAG = {f.flag: name for name, f in FIELDS.items()}

_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
_word = _text.filter(lambda s: not s.startswith("-"))
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    _text,
)
_json = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
_passthrough_word = _word.filter(lambda s: isinstance(parse_passthrough_scalar(s), str))
_passthrough_value = st.one_of(
    st.just(True),
    st.integers(-10, 10**6),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    _passthrough_word,
    st.lists(st.integers(0, 512), min_size=2, max_size=4),
)


def _number_bounds(f: FieldSpec) -> tuple[float | None, float | None]:
    low = f.ge if f.ge is not None else f.gt
    return low, f.le


def _within(f: FieldSpec, low: float, high: float) -> tuple[Any, Any]:
    """[low, high] narrowed to the item range of a list field (jobspec/bounds.py)."""
    kind = int if f.item_type == "int" else float
    return (
        kind(max(low, f.ge)) if f.ge is not None else kind(low),
        kind(min(high, f.le)) if f.le is not None else kind(high),
    )


def _strategy(f: FieldSpec) -> st.SearchStrategy[Any]:
    if f.kind == "passthrough":
        return st.dictionaries(
            st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), _passthrough_value, max_size=4
        )
    if f.kind in ("flag", "bool_value", "flag_off", "negatable"):
        base: st.SearchStrategy[Any] = st.booleans()
    elif f.pattern == "layers":
        base = st.one_of(st.integers(1, 8).map(str), st.integers(1, 48).map(lambda n: f"[1]*{n}"))
    elif f.pattern == "int_tuple":
        base = st.tuples(st.integers(-1, 4096), st.integers(0, 4096)).map(lambda t: f"{t[0]},{t[1]}")
    elif f.choices and f.kind == "int":
        base = st.sampled_from([int(c) for c in f.choices])
    elif f.choices and f.kind == "str":
        base = st.sampled_from(f.choices)
    elif f.kind == "int":
        low, high = _number_bounds(f)
        low = -1000 if low is None else int(math.ceil(low + (1 if f.gt is not None else 0)))
        base = st.integers(low, int(high) if high is not None else low + 10**6)
    elif f.kind == "float":
        low, high = _number_bounds(f)
        base = st.floats(
            min_value=low if low is not None else -1e6,
            max_value=high if high is not None else 1e6,
            exclude_min=f.gt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    elif f.kind == "str":
        base = _text
    elif f.kind in ("list", "append"):
        item = (
            st.sampled_from([int(c) for c in f.choices] if f.item_type == "int" else f.choices)
            if f.choices
            else st.integers(*_within(f, -5, 10**6))
            if f.item_type == "int"
            else st.floats(*_within(f, -1e6, 1e6), allow_nan=False, allow_infinity=False)
            if f.item_type == "float"
            else _word
        )
        low, high = (f.nargs, f.nargs) if isinstance(f.nargs, int) else (0 if f.nargs == "*" else 1, 4)
        base = st.lists(item, min_size=low, max_size=high)
        if f.kind == "append":
            base = st.lists(base, min_size=1, max_size=3)
    elif f.name == "resource":
        base = st.dictionaries(
            st.sampled_from(KNOWN_ROLES),
            st.tuples(st.integers(1, 2), st.integers(0, 16)).map(list),
            max_size=4,
        )
    elif f.kind == "json":
        values = _text if f.name in ("conversation_key_map", "multimodal_keys", "train_env_vars") else _json
        base = st.dictionaries(_text, values, max_size=3)
        if f.source != "reference":  # a generated type=json.loads flag takes any JSON value
            base = st.one_of(base, st.lists(_json_scalar.filter(lambda v: v is not None), max_size=3))
    else:  # pragma: no cover
        raise AssertionError(f.kind)
    return st.one_of(st.none(), base) if f.optional else base


WHOLE_SCHEMA = st.fixed_dictionaries({name: _strategy(f) for name, f in FIELDS.items()})


def _repair(values: dict[str, Any]) -> Any:
    values = {**values, **{k: v for k, v in BASE.items() if values.get(k) is None}}
    for _ in range(12):
        try:
            return normalize(obj=values).spec
        except SpecError as err:
            progressed = False
            for issue in err.errors:
                for flag in issue.fields or ([issue.field] if issue.field else []):
                    name = BY_FLAG.get(flag) or ("sglang" if flag.startswith("sglang-") else None)
                    if name is None:
                        continue
                    target = BASE.get(name)
                    if name in values and values[name] != target:
                        if target is None:
                            del values[name]
                        else:
                            values[name] = target
                        progressed = True
            if not progressed:
                return None
    return None


# Shrinking a 350-field example takes minutes, so it is off: a failure prints the drawn example as is. Each
# example sets ~350 fields at random (25 examples: ~9,000 values a run, ~1 s an example; new draws every run).
@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(WHOLE_SCHEMA)
def test_round_trip_over_the_whole_schema(values: dict[str, Any]) -> None:
    spec = _repair(values)
    assume(spec is not None)
    assert normalize(argv=spec.to_argv()).spec == spec
    assert normalize(obj=spec.to_dict()).spec == spec


def test_repair_keeps_most_random_values() -> None:
    """Guards the property above against degenerating into the base spec: a drawn spec survives repair
    with well over a hundred non-default fields."""
    kept: list[int] = []

    @settings(
        max_examples=5,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(WHOLE_SCHEMA)
    def draw(values: dict[str, Any]) -> None:
        spec = _repair(values)
        if spec is not None:
            kept.append(sum(1 for name, f in FIELDS.items() if getattr(spec, name) != f.default))

    draw()
    assert kept and max(kept) > 100, kept


def _validated_whole(values: dict[str, Any]) -> tuple[Any, list[Any], set[str]]:
    """`jobspec.intake.validate_spec` as it was: the model validates every field."""
    try:
        return JobSpec.model_validate(values, strict=True), [], set()
    except ValidationError as exc:
        issues, bad = issues_from_validation(exc, values)
        return (
            JobSpec.model_validate({k: v for k, v in values.items() if k not in bad}, strict=True),
            issues,
            bad,
        )


_NAMES = sorted(FIELDS)


@st.composite
def _given_values(draw: st.DrawFn) -> dict[str, Any]:
    """What a user gives: a few dozen fields of the table, most with a value of their type, some with any JSON
    value or a value of their type as text (a wrong type a lax validation would take, out of range)."""
    names = draw(st.lists(st.sampled_from(_NAMES), max_size=40, unique=True))
    wrong = [_json, *(_strategy(FIELDS[n]).map(str) for n in names)]
    return {
        n: draw(st.one_of(wrong[0], wrong[i + 1]) if draw(st.integers(0, 9)) == 0 else _strategy(FIELDS[n]))
        for i, n in enumerate(names)
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_given_values())
def test_validating_the_given_values_only_is_validating_the_whole_spec(values: dict[str, Any]) -> None:
    """`validate_spec` validates only the values given and takes the rest from the defaults' spec: the same
    spec (values, their types, the fields set), issues and refused fields as the model validating all ~1,060;
    the lists and dicts of the defaults are each spec's own."""
    spec, issues, bad = validate_spec(dict(values))
    whole, whole_issues, whole_bad = _validated_whole(dict(values))
    assert spec == whole
    assert list(spec.__dict__.items()) == list(whole.__dict__.items())
    assert {k: type(v) for k, v in spec.__dict__.items()} == {k: type(v) for k, v in whole.__dict__.items()}
    assert spec.model_fields_set == whole.model_fields_set
    assert (issues, bad) == (whole_issues, whole_bad)
    shared = default_spec().__dict__
    assert not [k for k, v in spec.__dict__.items() if isinstance(v, list | dict) and v is shared[k]]
