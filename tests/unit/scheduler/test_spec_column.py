"""What differs from the defaults, and back (scheduler/db/spec_column.py), without a database."""

from __future__ import annotations

import pytest

from scheduler.db.jsontext import json_dumps
from scheduler.db.spec_column import DEFAULTS_KEY, compact, current_defaults, expand, expand_with


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
