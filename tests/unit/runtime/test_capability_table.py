"""docs/reference/capabilities.md is generated from runtime/capabilities.py and kept up to date."""

from pathlib import Path

from runtime.capabilities import RESTRICTION_DOCS, RESTRICTIONS, render_markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "reference" / "capabilities.md"


def test_capability_table_is_up_to_date() -> None:
    assert DOC.read_text() == render_markdown(), (
        "run: python -m runtime.capabilities > docs/reference/capabilities.md"
    )


def test_every_restriction_is_documented() -> None:
    assert set(RESTRICTIONS) == set(RESTRICTION_DOCS)
