"""`RewardModel`: routing and its precedence, reward keys, user hooks by dotted path, group-rm, post-process."""

from __future__ import annotations

import asyncio
import logging
import pickle
from typing import Any

import pytest

from runtime.registry import UnknownNameError
from runtime.rewards import (
    REWARD_DETAIL_KEY,
    MissingRewardType,
    RewardHookError,
    RewardModel,
    RewardScorer,
    RewardValueError,
    SpecArgs,
    UnsupportedRewardType,
)
from runtime.spec import RuntimeSpec
from runtime.types import Sample


def _sample(response: str, label: Any = None, *, index: int = 0, group: int = 0, **metadata: Any) -> Sample:
    return Sample(
        index=index, group_index=group, prompt="q", label=label, response=response, metadata=dict(metadata)
    )


def _model(**values: Any) -> RewardModel:
    return RewardModel.from_spec(values)


# ---- the pipeline's existing calls keep working ----------------------------------------------------------------
def test_reward_scorer_keeps_its_constructor_and_return_value() -> None:
    samples = [_sample(r"\boxed{19}<|endoftext|>", "19"), _sample(r"\boxed{18}", "19"), _sample("19", "19")]
    assert RewardScorer("math").score(samples) == [1.0, 0.0, 0.0]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    with pytest.raises(UnknownNameError, match="math"):
        RewardScorer("nope")


def test_from_runtime_spec_reads_reward_parameters_from_extra() -> None:
    spec = RuntimeSpec.from_mapping({"rm-type": "dapo", "reward-key": "acc", "n-samples-per-prompt": 4})
    assert spec.extra["reward_key"] == "acc"
    model = RewardModel.from_spec(spec)
    assert model.config.reward_key == "acc"
    assert model.args.n_samples_per_prompt == 4 and model.args.rm_type == "dapo"
    assert model.score([_sample("Answer: 3", "4")]) == [0.0]  # acc False, where "score" would be -1


# ---- routing -----------------------------------------------------------------------------------------------------
def test_sample_metadata_rm_type_wins_over_the_spec() -> None:
    samples = [
        _sample(r"\boxed{7}", "7"),
        _sample("Answer: 7", "7", index=1, rm_type="dapo"),
        _sample("The answer is 7", "#### 7", index=2, rm_type="gsm8k"),
        _sample(r"x \boxed{red fox}", "red fox", index=3, rm_type="boxed_f1"),
    ]
    assert _model(rm_type="math").score(samples) == [1.0, 1.0, 1.0, 1.0]


def test_unknown_and_unsupported_types_fail_clearly() -> None:
    with pytest.raises(UnknownNameError, match="valid names: .*exact_match"):
        _model(rm_type="exact")
    with pytest.raises(UnsupportedRewardType, match="ifbench.*not supported.*remote_rm"):
        _model(rm_type="ifbench")
    with pytest.raises(UnsupportedRewardType, match="dapo-genrm.*GenRM"):
        _model(rm_type="math").score([_sample("x", "y", rm_type="dapo-genrm")])
    with pytest.raises(UnknownNameError, match="sample 3: rm_type 'maths'"):
        _model(rm_type="math").score([_sample("x", "y", index=3, rm_type="maths")])
    with pytest.raises(MissingRewardType, match="sample 0 has no reward type"):
        _model().score([_sample("x", "y")])
    with pytest.raises(ValueError, match="remote_rm needs rm-url"):
        _model(rm_type="remote_rm")


def test_fallback_and_inference(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runtime.rewards")
    zero = _model(rm_type_fallback="zero")
    samples = [_sample(r"\boxed{1}", "1"), _sample("x", "y", index=1, rm_type="mystery")]
    assert zero.score(samples) == [0.0, 0.0]
    assert zero.score(samples) == [0.0, 0.0]
    assert zero.router.degradations == {("missing", ""): 2, ("unknown", "mystery"): 2}
    assert sum("rm-type-fallback" in r.message for r in caplog.records) == 2  # once per case

    named = _model(rm_type="nonsense", rm_type_fallback="boxed_exact_match")
    assert named.score([_sample(r"\boxed{ok}", "ok")]) == [1.0]

    infer = _model(rm_type_infer=True)
    samples = [
        _sample(r"so \boxed{12}", "12"),  # a bare number: math
        _sample("The answer is (C)", "<answer>C</answer>", index=1),  # multiple_choice
        _sample("The answer is 5", "2 + 3 = 5\n#### 5", index=2),  # gsm8k
    ]
    assert infer.score(samples) == [1.0, 1.0, 1.0]
    explicit = _model(rm_type="exact_match", rm_type_infer=True)
    assert explicit.score([_sample("12", "12")]) == [1.0]  # exact_match, not the inferred math (no box)
    assert ("conflict", "exact_match (explicit) vs math (label)") in explicit.router.degradations


# ---- reward keys ---------------------------------------------------------------------------------------------------
def test_reward_key_picks_from_dicts_and_the_dict_is_kept() -> None:
    sample = _sample("Answer: 5", "4")
    assert _model(rm_type="dapo").score([sample]) == [-1.0]  # no key: a dict's "score"
    assert sample.metadata[REWARD_DETAIL_KEY] == {"score": -1.0, "acc": False, "pred": "5"}

    model = _model(rm_type="dapo", reward_key="score", eval_reward_key="acc")
    assert model.score([sample]) == [-1.0]
    assert model.score([sample], eval_mode=True) == [0.0]
    numeric = _model(rm_type="math", reward_key="score")
    assert numeric.score([_sample(r"\boxed{1}", "1")]) == [1.0]  # a number is used as it is

    with pytest.raises(RewardValueError, match=r"sample 0 \(rm-type dapo\): reward-key 'nope'.*acc"):
        _model(rm_type="dapo", reward_key="nope").score([sample])


# ---- user hooks ------------------------------------------------------------------------------------------------------
def test_custom_rm_path_one_argument_and_relax_signatures(hooks_module: str) -> None:
    samples = [_sample("abcd", "x"), _sample("xyz", "xyz", index=1, rm_type="math")]
    by_length = _model(rm_type="math", custom_rm_path=f"{hooks_module}.by_length")
    assert by_length.score(samples) == [4.0, 3.0]  # custom-rm-path bypasses routing, metadata too

    relax = _model(custom_rm_path=f"{hooks_module}.relax_style", reward_key="acc", my_bonus=0.5)
    assert relax.score(samples) == [0.0, 1.0]
    assert samples[1].metadata[REWARD_DETAIL_KEY] == {"acc": 1.0, "bonus": 0.5}  # args carry spec values


def test_async_hooks_keep_their_event_loop_across_batches(hooks_module: str) -> None:
    model = _model(custom_rm_path=f"{hooks_module}.cached_session")
    assert model.score([_sample("a")]) + model.score([_sample("b")]) == [1.0, 1.0]

    async def from_async_code() -> list[float]:
        return model.score([_sample("c")])

    assert asyncio.run(from_async_code()) == [1.0]  # via a helper thread, still on the same loop
    model.close()


def test_a_model_pickles_for_ray(hooks_module: str) -> None:
    model = _model(rm_type="math", custom_reward_post_process_path=f"{hooks_module}.post_process", extra=1)
    copy = pickle.loads(pickle.dumps(model))
    samples = [_sample(r"\boxed{2}", "2")]
    assert copy.score(samples) == [1.0] and copy.post_process(samples) == [10.0] and copy.args.extra == 1


def test_custom_hooks_fail_with_their_path(hooks_module: str) -> None:
    with pytest.raises(RewardHookError, match=r"custom-rm-path 'no_such_module.fn' cannot be loaded"):
        _model(custom_rm_path="no_such_module.fn")
    with pytest.raises(RewardHookError, match="is a int, not a function"):
        _model(custom_rm_path=f"{hooks_module}.NOT_A_FUNCTION")
    with pytest.raises(RewardHookError, match=r"boom' failed on sample 2 \(group 1\): RuntimeError: kaput"):
        _model(custom_rm_path=f"{hooks_module}.boom").score([_sample("x", index=2, group=1)])
    with pytest.raises(RewardHookError, match="args is read-only"):
        _model(custom_rm_path=f"{hooks_module}.writes_args").score([_sample("x")])


def test_group_rm_passes_each_group_once(hooks_module: str) -> None:
    samples = [_sample(str(i), "1", index=i, group=i % 2) for i in range(6)]  # groups interleaved
    model = _model(custom_rm_path=f"{hooks_module}.group_rank", group_rm=True)
    assert model.score(samples) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]  # rank within its own group

    async_one_arg = _model(custom_rm_path=f"{hooks_module}.group_async", group_rm=True)
    assert async_one_arg.score(samples) == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]

    short = _model(custom_rm_path=f"{hooks_module}.short_group", group_rm=True)
    with pytest.raises(RewardHookError, match="one reward per sample: group 0 has 3 samples, it returned 1"):
        short.score(samples)


def test_post_process_defaults_to_raw_rewards_and_loads_relax_shapes(hooks_module: str) -> None:
    samples = [_sample(r"\boxed{1}", "1"), _sample(r"\boxed{2}", "1", index=1)]
    default = _model(rm_type="math", custom_reward_post_process_path="relax.utils.utils.post_process_rewards")
    default.score(samples)
    assert default.post_process(samples) == [1.0, 0.0] and not default.replaces_reward_normalization

    tupled = _model(rm_type="math", custom_reward_post_process_path=f"{hooks_module}.post_process")
    assert tupled.post_process(samples) == [10.0, 0.0] and tupled.replaces_reward_normalization

    listed = _model(
        rm_type="math",
        n_samples_per_prompt=2,
        custom_reward_post_process_path=f"{hooks_module}.post_process_list",
    )
    assert listed.post_process(samples) == [2.0, 2.0]


def test_relax_reward_entry_points_resolve_to_ours() -> None:
    builtin = _model(rm_type="math", custom_rm_path="relax.engine.rewards.async_rm")
    assert builtin.custom is None and builtin.score([_sample(r"\boxed{1}", "1")]) == [1.0]
    with pytest.raises(ValueError, match="remote_rm needs rm-url"):
        _model(custom_rm_path="relax.engine.rewards.remote_rm")


def test_spec_args_are_read_only_and_picklable() -> None:
    args = SpecArgs({"rm_url": "http://x", "disable_grpo_std_normalization": False})
    assert args.rm_url == "http://x" and args.grpo_std_normalization is True
    with pytest.raises(AttributeError, match="read-only"):
        args.rm_url = "http://y"
    with pytest.raises(AttributeError, match="no parameter 'nope'"):
        _ = args.nope
    assert pickle.loads(pickle.dumps(args)).rm_url == "http://x"


def test_score_works_inside_a_running_event_loop() -> None:
    model = _model(rm_type="exact_match")

    async def caller() -> list[float]:
        return model.score([_sample("a", "a")])  # the sync entry point, called from async code

    assert asyncio.run(caller()) == [1.0]
    assert asyncio.run(model.ascore([_sample("a", "b")])) == [0.0]
    assert model.score([]) == []
