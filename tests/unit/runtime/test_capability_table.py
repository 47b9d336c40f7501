"""docs/reference/capabilities.md is generated from runtime/capabilities.py and kept up to date."""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobspec import FIELDS
from runtime.capabilities import (
    BACKEND_PARAMETERS,
    RESTRICTION_DOCS,
    RESTRICTIONS,
    RM_TYPES,
    UNSUPPORTED_RM_TYPES,
    render_markdown,
    unsupported_parameters,
)
from runtime.rewards import UNSUPPORTED_RM_TYPES as REWARDS_REFUSED
from runtime.rewards import known_rm_types
from runtime.spec import parameter_defaults
from tests.unit.jobspec.test_roundtrip import _strategy

DOC = Path(__file__).resolve().parents[3] / "docs" / "reference" / "capabilities.md"


def test_capability_table_is_up_to_date() -> None:
    assert DOC.read_text() == render_markdown(), (
        "run: python -m runtime.capabilities > docs/reference/capabilities.md"
    )


def test_every_restriction_is_documented() -> None:
    assert set(RESTRICTIONS) == set(RESTRICTION_DOCS)


def test_rm_type_names_match_the_reward_stage() -> None:
    """The capability check lists the reward stage's names itself (the API process must not import it)."""
    assert set(known_rm_types()) == RM_TYPES
    assert set(REWARDS_REFUSED) == UNSUPPORTED_RM_TYPES


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_comparing_only_the_changed_names_refuses_the_same(data: st.DataObject) -> None:
    """`unsupported_parameters(..., changed)` compares only the names that may differ from their defaults (a
    submission passes `NormalizedSpec.changed`) and checks every restricted name: the same refusals as the
    walk over every value, for specs that set any few dozen parameters, on each backend (and an unknown one)."""
    defaults = parameter_defaults() or {}
    names = data.draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=30, unique=True), label="names")
    given_values = {n: data.draw(_strategy(FIELDS[n]), label=n) for n in names}
    backend = data.draw(st.sampled_from([*sorted(BACKEND_PARAMETERS), "fsdp", None]), label="backend")
    if backend is not None:
        given_values["train_backend"] = backend
    values = {**defaults, **given_values}
    want = unsupported_parameters(values, defaults)
    assert unsupported_parameters(values, defaults, frozenset(given_values)) == want
