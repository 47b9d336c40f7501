"""The two kinds of pipeline (runtime/pipeline/): each built whole, the builder picking by the spec, and the
spec rules left to jobspec (the driver's spec loader refuses what the pipeline used to re-check)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from jobspec import SpecError
from runtime.pipeline import PipelineBase, RLPipeline, SFTPipeline
from runtime.pipeline.rl import check_rl_spec
from runtime.pipeline.sft import check_sft_spec
from runtime.spec import RuntimeSpec, load_spec, read_spec_file

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


# Each check `runtime.pipeline.validate` repeated, with the jobspec rule that refuses it at submission (and
# in `load_spec`, which is how the driver reads a spec file).
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


def test_what_only_the_pipeline_checks() -> None:
    """Checks jobspec does not make (yet): the builder refuses them before it reads data or starts roles."""
    rl = RuntimeSpec(hf_checkpoint="/m", prompt_data="/d", rollout_batch_size=4, num_rollout=1)
    with pytest.raises(ValueError, match="rm_type"):
        check_rl_spec(rl)
    check_rl_spec(dataclasses.replace(rl, rm_type_infer=True))
    check_rl_spec(dataclasses.replace(rl, rm_type_fallback="zero"))
    with pytest.raises(ValueError, match="load_debug_rollout_data"):
        check_rl_spec(dataclasses.replace(rl, rm_type="math", debug_train_only=True))
    # stricter than jobspec's rule.prompt_data_required: a custom data source still needs prompt_data
    with pytest.raises(ValueError, match="prompt_data"):
        check_rl_spec(dataclasses.replace(rl, rm_type="math", prompt_data=None, data_source_path="a.b"))
    check_rl_spec(dataclasses.replace(rl, prompt_data=None, load_debug_rollout_data="/d/{rollout_id}.pt"))

    sft = dataclasses.replace(rl, loss_type="sft")
    check_sft_spec(sft)
    with pytest.raises(ValueError, match="sft_predict_interval"):
        check_sft_spec(dataclasses.replace(sft, debug_train_only=True, sft_predict_interval=2))
    with pytest.raises(ValueError, match="prompt_data"):
        check_sft_spec(dataclasses.replace(sft, prompt_data=None))
