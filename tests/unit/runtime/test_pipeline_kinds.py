"""The two kinds of pipeline (runtime/pipeline/): each built whole, the builder picking by the spec, and the
spec rules left to jobspec (the driver's spec loader refuses what the pipeline used to re-check)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobspec import SpecError
from runtime.data.prompts import DatasetConfig, PromptFormatter, PromptItem
from runtime.data.source import DataSourceInit, RolloutDataSource
from runtime.pipeline import PipelineBase, PipelineParts, RLPipeline, SFTPipeline
from runtime.pipeline.plans import dataset_config
from runtime.pipeline.rl import build_rl
from runtime.spec import RuntimeSpec, load_spec, read_spec_file
from tests.unit.runtime.fakes import EOS, CharTokenizer, ScriptedEngine

ROOT = Path(__file__).resolve().parents[3]

# The fields that may hold None, each for a reason of the job's options (never of its kind).
NULLABLE = {
    "relay": "the roles have no log sink",
    "generation": "RL on loaded rollouts (load-debug-rollout-data)",
    "reward": "RL on loaded rollouts without custom-reward-post-process-path",
    "postprocess": "rollout-data-postprocess-path unset",
    "last_rollout": "state: no rollout trained yet",
    "last_critic_save": "state: no critic checkpoint yet",
}


@pytest.mark.parametrize("kind", [RLPipeline, SFTPipeline])
def test_each_kind_has_no_optional_field_but_the_named_ones(kind: type) -> None:
    hints = typing.get_type_hints(kind)
    nullable = {
        f.name for f in dataclasses.fields(kind) if type(None) in typing.get_args(hints[f.name]) and f.init
    }
    state = {f.name for f in dataclasses.fields(kind) if not f.init}
    assert nullable <= set(NULLABLE), nullable - set(NULLABLE)
    assert state <= {"pending_pushes", "_warned", "last_rollout", "last_critic_save"}
    # every constructor argument is required: built whole, nothing filled in afterwards
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(kind)
        if f.init
    )


def test_the_kinds_share_only_the_base() -> None:
    rl = {f.name for f in dataclasses.fields(RLPipeline)}
    sft = {f.name for f in dataclasses.fields(SFTPipeline)}
    assert rl & sft == {f.name for f in dataclasses.fields(PipelineBase)}


def _raw(example: str, tmp_path: Path, **changes: Any) -> dict[str, Any]:
    raw, _ = read_spec_file(ROOT / "examples" / example)
    raw = {k: (str(tmp_path) if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    if "eval-prompt-data" in raw:
        raw["eval-prompt-data"] = ["arith", str(tmp_path)]
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


# Each check the pipeline made (`runtime.pipeline.validate`'s copies of jobspec rules, then the checks only
# `check_rl_spec` / `check_sft_spec` made), with the jobspec rule that refuses it at submission (and in
# `load_spec`, which is how the driver reads a spec file).
REMOVED = {
    "hf_checkpoint": ("grpo-arith.yaml", {"hf-checkpoint": None}, "rule.hf_checkpoint_required"),
    "rollout_batch_size": (
        "grpo-arith.yaml",
        {"rollout-batch-size": None, "global-batch-size": None},
        "rule.rollout_batch_size_required",
    ),
    "num_rollout_or_num_epoch": ("grpo-arith.yaml", {"num-rollout": None}, "rule.num_rollout_or_num_epoch"),
    "rl_prompt_data": ("grpo-arith.yaml", {"prompt-data": None}, "rule.prompt_data_required"),
    "sft_prompt_data": ("sft-arith.yaml", {"prompt-data": None}, "rule.sft_needs_prompt_data"),
    "rollout_external_addrs": (
        "grpo-arith.yaml",
        {"rollout-external": True},
        "rule.rollout_external_needs_addrs",
    ),
    "save_interval_needs_save": ("grpo-arith.yaml", {"save": None}, "rule.save_interval_needs_save"),
    "rl_debug_train_only_needs_rollout_data": (
        "grpo-arith.yaml",
        {"debug-train-only": True},
        "rule.debug_train_only_needs_rollout_data",
    ),
    "sft_predict_interval_without_debug_train_only": (
        "sft-arith.yaml",
        {"sft-predict-interval": 5, "eval-size": 0.1, "debug-train-only": True},
        "rule.sft_predict_interval_without_debug_train_only",
    ),
    "sft_predict_interval_needs_save": (
        "sft-arith.yaml",
        {"save": None, "save-interval": None, "sft-predict-interval": 5, "eval-size": 0.1},
        "rule.sft_predict_interval_requirements",
    ),
}


@pytest.mark.parametrize("check", sorted(REMOVED))
def test_the_spec_rules_the_pipeline_no_longer_repeats_are_refused_by_the_loader(
    check: str, tmp_path: Path
) -> None:
    example, changes, code = REMOVED[check]
    load_spec(_raw(example, tmp_path))  # the example itself loads
    with pytest.raises(SpecError) as refused:
        load_spec(_raw(example, tmp_path, **changes))
    assert code in [issue.code for issue in refused.value.issues if issue.is_error]


def test_fully_async_with_colocate_is_hybrid_never_colocated(tmp_path: Path) -> None:
    """The pipeline refused fully_async with `colocated`; jobspec reads the pair as hybrid, and a hybrid
    spec is not `colocated`, so that check could not fire."""
    spec = RuntimeSpec(fully_async=True, colocate=True)
    assert not spec.colocated
    assert not RuntimeSpec(hybrid=True, colocate=True).colocated


class GeneratedPrompts(RolloutDataSource):
    """A `data-source-path` class that makes its own prompts (it reads no `prompt-data`), each naming its
    reward in its metadata."""

    def __init__(self, init: DataSourceInit) -> None:
        items = [PromptItem(i, f"{i}+{i}=|", str(2 * i), {"rm_type": "math"}, {}) for i in range(3)]
        super().__init__(dataclasses.replace(init, items=items))


def test_a_custom_data_source_runs_without_prompt_data_or_rm_type(tmp_path: Path) -> None:
    """The pipeline used to refuse any RL spec without prompt-data, and any without a reward option; the
    runtime runs one whose data source makes its prompts (as jobspec's rule.prompt_data_required lets
    through: `build_pipeline` reads no prompt file and hands the builder no items), scoring each sample by
    its metadata rm_type (Relax's precedence; jobspec's rule.rm_type_unset only warns)."""
    raw = _raw(
        "grpo-arith.yaml",
        tmp_path,
        **{
            "prompt-data": None,
            "rm-type": None,
            "eval-prompt-data": None,
            "eval-interval": None,
            "data-source-path": f"{__name__}.GeneratedPrompts",
            "rollout-batch-size": 2,
            "n-samples-per-prompt": 2,
            "global-batch-size": 4,
            "micro-batch-size": 4,
            "rollout-shuffle": False,
            "rollout-max-response-len": 16,
        },
    )
    spec = load_spec(raw)
    assert spec.prompt_data is None and spec.rm_type is None and spec.generates
    # right for 1+1, wrong for 0+0
    engine = ScriptedEngine(lambda prompt: [ord(c) for c in "\\boxed{2}"] + [EOS])
    parts = PipelineParts(
        spec=spec,
        reporter=None,
        tokenizer=CharTokenizer(),
        roles=SimpleNamespace(rollout=engine),
        total_rollouts=spec.total_rollouts(0),
        checkpoints=None,
        weight_sync=None,
        relay=None,
    )
    formatter = PromptFormatter(CharTokenizer(), dataset_config(spec))
    pipeline = build_rl(parts, formatter, [])
    try:
        assert pipeline.generation is not None and isinstance(pipeline.generation.data, GeneratedPrompts)
        output = pipeline.source.collect(0)
    finally:
        assert pipeline.reward is not None
        pipeline.reward.close()
    assert [group[0].prompt for group in output.groups] == ["0+0=|", "1+1=|"]
    assert [sample.reward for group in output.groups for sample in group] == [0.0, 0.0, 1.0, 1.0]  # math
    assert engine.calls  # the samples were generated


def test_the_default_data_source_without_prompt_data_refuses_to_draw(tmp_path: Path) -> None:
    """rule.prompt_data_required also lets through a custom rollout function without prompt-data (it may
    make its own samples); one that still draws from the default data source gets an error, not a hang."""
    init = DataSourceInit(
        items=[],
        formatter=PromptFormatter(CharTokenizer(), DatasetConfig()),
        n_samples_per_prompt=2,
        shuffle=True,
        seed=0,
    )
    with pytest.raises(ValueError, match="no prompts to draw"):
        RolloutDataSource(init).get_groups(1)
    assert RolloutDataSource(init).get_groups(0) == []


def test_the_rules_moved_from_the_pipeline_let_through_what_the_runtime_runs(tmp_path: Path) -> None:
    """Each check the pipeline made alone, now a jobspec rule: the specs the runtime runs still load."""
    loaded = {"debug-train-only": True, "load-debug-rollout-data": str(tmp_path / "{rollout_id}.pt")}
    assert load_spec(_raw("grpo-arith.yaml", tmp_path, **loaded)).debug_train_only  # trains on saved rollouts
    sft = load_spec(_raw("sft-arith.yaml", tmp_path, **{"debug-train-only": True}))  # SFT reads prompt-data
    assert sft.debug_train_only and sft.is_sft and not sft.generates
    # no reward option: each sample's metadata.rm_type picks its reward (a warning, not a refusal)
    for option in ({}, {"rm-type-fallback": "zero"}, {"rm-type-infer": True}, {"custom-rm-path": "pkg.rm"}):
        spec = load_spec(_raw("grpo-arith.yaml", tmp_path, **{"rm-type": None, **option}))
        assert spec.rm_type is None
