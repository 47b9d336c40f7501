"""docs/reference/capabilities.md is generated from runtime/capabilities.py and kept up to date."""

from pathlib import Path

from runtime.capabilities import (
    RESTRICTION_DOCS,
    RESTRICTIONS,
    RM_TYPES,
    UNSUPPORTED_RM_TYPES,
    render_markdown,
)
from runtime.rewards import UNSUPPORTED_RM_TYPES as REWARDS_REFUSED
from runtime.rewards import known_rm_types

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
