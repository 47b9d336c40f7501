"""Did-you-mean suggestions for unknown parameter names (difflib over every Relax flag)."""

from __future__ import annotations

import difflib
from functools import lru_cache

from jobspec.spec import FIELDS


@lru_cache(maxsize=1)
def _candidates() -> tuple[str, ...]:
    names: list[str] = []
    for f in FIELDS.values():
        if f.kind == "passthrough":
            continue
        names.append(f.flag)
        names.extend(f.aliases)
        names.extend(flag for flag in f.switches if flag != f.flag)
    return tuple(names)


@lru_cache(maxsize=256)  # one_per_mistake asks again about the flags it was asked about first
def suggest_flag(flag: str) -> str | None:
    """The closest known flag to `flag` (hyphen form), or None when nothing is close."""
    wanted = flag.strip().lstrip("-").replace("_", "-").lower()
    matches = difflib.get_close_matches(wanted, _candidates(), n=1, cutoff=0.6)
    return matches[0] if matches else None
