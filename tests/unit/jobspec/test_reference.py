"""Every parameter of the Relax configuration reference is a field, and the generated docs are current."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from jobspec import FIELDS
from jobspec.argv import decode_argv
from jobspec.docs import render_parameters_md
from jobspec.spec import field_for_flag

HERE = Path(__file__).parent
REPO = HERE.parents[2]
# Flag names of both reference files (configuration.zh.txt and configuration.en.txt), one per line,
# extracted with the regex below; kept here so the check runs where the seed files are absent.
CHECKED_IN = HERE / "reference_flags.txt"
SEED_DIRS = [
    Path(p)
    for p in (os.environ.get("RELAX_SEEDS_DIR", ""), REPO / "shared" / "seeds", "/work/shared/seeds")
    if p
]
FLAG_RE = re.compile(r"--[a-z][a-z0-9-]*")

# Flags the reference mentions that are deliberately not fields, and why.
NOT_FIELDS = {
    "help": "argparse's own --help",
    "sglang": "the prose naming the --sglang-* prefix; every --sglang-<name> passes through into `sglang`",
    "sglang-mem-fraction-static": "an SGLang server argument: passes through into `sglang` (mem_fraction_static)",
    "mem-fraction-static": "SGLang's own spelling, shown to explain the prefix; only --sglang-mem-fraction-static is valid",
    "prefetch-": "prose fragment '--prefetch-*' naming the prefetch-chunk-size/-max-cached/-num-workers family",
    # Megatron-LM flags of versions later than 3714d81, the commit Relax pins: Relax's parser ignores
    # them; the spec refuses them naming why (jobspec.arguments.NOT_AT_PINNED_MEGATRON).
    "no-use-precision-aware-optimizer": "not a flag of Megatron-LM at 3714d81",
}


def reference_flags() -> set[str]:
    for d in SEED_DIRS:
        files = [d / "configuration.zh.txt", d / "configuration.en.txt"]
        if all(f.is_file() for f in files):
            return {m[2:] for f in files for m in FLAG_RE.findall(f.read_text(encoding="utf-8"))}
    return set(CHECKED_IN.read_text().split())


def test_checked_in_flag_list_matches_the_seed_files() -> None:
    for d in SEED_DIRS:
        files = [d / "configuration.zh.txt", d / "configuration.en.txt"]
        if all(f.is_file() for f in files):
            assert reference_flags() == set(CHECKED_IN.read_text().split())
            return
    pytest.skip("seed files not present; the checked-in list is used")


def test_every_reference_parameter_is_a_field() -> None:
    missing = []
    for flag in sorted(reference_flags()):
        if flag in NOT_FIELDS:
            continue
        if field_for_flag(flag) is None:
            missing.append(flag)
    assert not missing, f"reference parameters without a field: {missing}"


def test_excluded_flags_are_still_accepted_where_relax_accepts_them() -> None:
    decoded = decode_argv(["--sglang-mem-fraction-static", "0.7"])
    assert decoded.values == {"sglang": {"mem_fraction_static": 0.7}} and not decoded.issues
    assert decode_argv(["--mem-fraction-static", "0.7"]).issues[0].code == "spec.unknown_key"


def test_every_field_has_help_group_and_flag() -> None:
    for name, f in FIELDS.items():
        assert f.help and f.group and f.flag, name
        assert f.kind != "flag" or f.default is False, f"{name}: a store_true flag must default to false"


def test_generated_reference_page_is_up_to_date() -> None:
    page = REPO / "docs" / "reference" / "parameters.md"
    assert page.read_text(encoding="utf-8") == render_parameters_md(), (
        "docs/reference/parameters.md is stale: run `python -m jobspec.docs > docs/reference/parameters.md`"
    )
