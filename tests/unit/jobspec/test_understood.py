"""One mistake, one issue; and what a spec with errors still says (SpecError.understood)."""

from __future__ import annotations

import pytest

from jobspec import SpecError, normalize
from jobspec.normalization import one_per_mistake


def understood(obj: object = None, argv: list[str] | None = None):
    with pytest.raises(SpecError) as info:
        normalize(argv=argv) if argv is not None else normalize(obj=obj)
    return info.value.understood


BASE = [
    "--train-backend",
    "torch",
    "--hf-checkpoint",
    "/m",
    "--prompt-data",
    "/d.jsonl",
    "--rm-type",
    "math",
    "--rollout-batch-size",
    "8",
    "--num-rollout",
    "2",
    "--colocate",
    "--resource",
    '{"actor": [1, 1], "rollout": [1, 1]}',
]


def _without(flag: str) -> list[str]:
    argv = list(BASE)
    i = argv.index(flag)
    del argv[i : i + 2]
    return argv


def _issues(argv: list[str] | None = None, obj: dict | None = None) -> list[tuple[str, str | None]]:
    with pytest.raises(SpecError) as info:
        normalize(argv=argv) if argv is not None else normalize(obj=obj)
    assert one_per_mistake(info.value.issues) == info.value.issues  # normalize() already applies it
    return [(i.code, i.field) for i in info.value.issues]


@pytest.mark.parametrize(
    "argv,expected",
    [
        (_without("--rollout-batch-size") + ["--rollout-batch-size", "eight"], "rollout-batch-size"),
        (_without("--num-rollout") + ["--num-rollout", "x"], "num-rollout"),
        (_without("--hf-checkpoint") + ["--hf-checkpoint"], "hf-checkpoint"),
        (_without("--resource") + ["--resource", "{not json"], "resource"),
        (_without("--rollout-batch-size") + ["--rollout-batch-sise", "8"], "rollout-batch-sise"),
    ],
)
def test_a_refused_value_is_not_reported_again_by_a_rule(argv: list[str], expected: str) -> None:
    assert _issues(argv) == [(_code(argv, expected), expected)]


def _code(argv: list[str], field: str) -> str:
    with pytest.raises(SpecError) as info:
        normalize(argv=argv)
    return next(i.code for i in info.value.issues if i.field == field)


def test_object_keys_misspelt_do_not_make_their_field_required() -> None:
    obj = {
        "train-backend": "torch",
        "hf-checkpoint": "/m",
        "prompt-data": "/d",
        "rm-type": "math",
        "rollout-batch-sise": 8,
        "num-rollout": 2,
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
    }
    assert _issues(obj=obj) == [("spec.unknown_key", "rollout-batch-sise")]


def test_independent_mistakes_are_all_kept() -> None:
    argv = _without("--num-rollout") + ["--num-rollout", "x", "--global-batch-size", "12"]
    assert [code for code, _ in _issues(argv)] == [
        "spec.invalid_type",
        "rule.global_batch_size_divides_rollout",
    ]


def test_what_was_understood_of_a_spec_with_errors() -> None:
    argv = _without("--rollout-batch-size") + ["--rollout-batch-size", "eight", "--bogus-flag", "1"]
    known = understood(argv=argv)
    assert known.spec is not None and known.spec["hf_checkpoint"] == "/m"
    assert known.spec["rollout_batch_size"] is None
    assert known.argv is not None and "--hf-checkpoint" in known.argv and "--bogus-flag" not in known.argv
    assert "eight" not in known.argv
    assert known.derived.get("offload_train") is True  # colocate's derived offloading
    assert known.demand is not None and known.demand["total_gpus"] == 1


def test_nothing_understood_and_partly_understood() -> None:
    assert understood(obj="not a mapping") is None
    partial = understood(argv=["--resource", "{", "--lr", "x", "--hf-checkpoint", "/m"])
    assert partial is not None and "--hf-checkpoint" in partial.argv
