"""What differs from the defaults, and back (scheduler/db/spec_column.py), without a database."""

from __future__ import annotations

import pytest

from scheduler.db.jsontext import json_dumps
from scheduler.db.spec_column import (
    DEFAULTS_KEY,
    compact,
    current_defaults,
    differing_at_most_in,
    expand,
    expand_with,
)


def test_only_what_differs_is_kept_and_json_types_count() -> None:
    ident, defaults = current_defaults()
    assert defaults["seed"] == 1234 and defaults["lr"] == 1e-6 and defaults["colocate"] is False
    whole = dict(defaults, seed=7, lr=1e-6)
    assert compact(whole) == {DEFAULTS_KEY: ident, "seed": 7}
    # 1234.0 and True are other JSON values than 1234 and 1: kept, and read back as given
    odd = dict(defaults, seed=1234.0, colocate=0)
    stored = compact(odd)
    assert stored == {DEFAULTS_KEY: ident, "seed": 1234.0, "colocate": 0}
    back = expand(stored)
    assert type(back["seed"]) is float and type(back["colocate"]) is int
    assert json_dumps(back) == json_dumps(odd)


def test_a_partial_dict_and_unknown_keys_come_back_as_they_were() -> None:
    partial = {"lr": 0.5, "not_a_parameter": [1]}
    stored = compact(partial)
    assert stored["lr"] == 0.5 and stored["not_a_parameter"] == [1] and "seed" in stored["$absent"]
    assert expand(stored) == partial
    assert compact(stored) is stored  # already compact


def test_each_spec_read_gets_its_own_lists_and_dicts() -> None:
    ident, defaults = current_defaults()
    key = next(k for k, v in defaults.items() if isinstance(v, list | dict))
    before = json_dumps(defaults[key])
    a, b = expand({DEFAULTS_KEY: ident}), expand({DEFAULTS_KEY: ident})
    assert a == b == defaults
    a[key].append("x") if isinstance(a[key], list) else a[key].update(x=1)
    assert json_dumps(b[key]) == before == json_dumps(defaults[key])


def test_defaults_nobody_recorded_are_an_error_that_says_what_to_do() -> None:
    with pytest.raises(LookupError, match="spec_defaults.*scheduler.dbinit"):
        expand({DEFAULTS_KEY: "ffffffffffffffffffff", "seed": 3})
    with pytest.raises(LookupError, match="does not hold"):
        expand_with({DEFAULTS_KEY: "ffffffffffffffffffff"}, {})
    assert expand_with({DEFAULTS_KEY: "old", "seed": 3}, {"old": '{"seed": 1, "lr": 2.0}'}) == {
        "seed": 3,
        "lr": 2.0,
    }


def _normalized_specs() -> list[tuple[dict, frozenset]]:
    """Specs `normalize` made of the examples (and of them varied), their path fields rewritten as path
    resolution does, with the names `JobSubmission.submit` passes to `differing_at_most_in`."""
    import random
    from pathlib import Path

    import yaml

    import jobspec

    rng = random.Random(5)
    out = []
    for path in sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        for _ in range(3):
            varied = dict(spec, lr=rng.choice([1e-6, 1e-4, 3]), colocate=rng.random() < 0.5)
            varied["seed"] = rng.choice([1234, 1234.0, 9])
            try:
                n = jobspec.normalize(obj=varied, max_gpus_per_node=8)
            except jobspec.SpecError:
                continue
            resolved = dict(n.spec_dict())
            for name in jobspec.path_fields():
                if isinstance(resolved.get(name), str):
                    resolved[name] = "/areas/team/" + resolved[name].removeprefix("artifacts://")
            out.append((resolved, n.changed | set(jobspec.path_fields())))
    return out


def test_comparing_only_the_changed_names_stores_what_comparing_all_stores() -> None:
    """`differing_at_most_in` (what `submit` wraps the job's INSERT in): for a spec `normalize` made, with its
    paths resolved, comparing its given, derived and path fields only gives the same stored JSON, key order
    included; another dict, even an equal one, is compared whole."""
    cases = _normalized_specs()
    assert len(cases) > 10
    for spec, names in cases:
        whole = compact(spec)
        with differing_at_most_in(spec, names):
            assert json_dumps(compact(spec)) == json_dumps(whole)
            other = dict(spec, seed=spec["seed"] + 1)
            assert compact(other)["seed"] == spec["seed"] + 1  # not `spec`: compared whole
        assert len(whole) > 5
