"""The generated argument surface: Megatron-LM's parser and Relax's argument code, as fields."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobspec import SpecError, normalize
from jobspec.arguments import (
    FIELD_DEVIATIONS,
    MEGATRON,
    NOT_AT_PINNED_MEGATRON,
    RELAX,
    field_from_entry,
    layer_pattern,
)
from jobspec.argv import decode_argv
from jobspec.spec import FIELDS, _field_spec, field_for_flag

REPO = Path(__file__).resolve().parents[3]
REFERENCE = next(
    (
        Path(p)
        for p in (
            os.environ.get("RELAX_REFERENCE_DIR", ""),
            REPO.parent / "shared" / "reference",
            "/work/shared/reference",
        )
        if p and (Path(p) / "megatron-lm_3714d81_training_arguments.py").is_file()
    ),
    REPO.parent / "shared" / "reference",
)
REQUIRED = ["--rollout-batch-size", "8", "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl"]
REQUIRED += ["--num-rollout", "2", "--colocate", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}']


def _spec(*argv: str):
    return normalize(argv=[*REQUIRED, *argv]).spec


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="Megatron-LM's and Relax's argument modules are not here")
def test_generated_tables_are_up_to_date() -> None:
    """The committed tables are what the generator reads from the argument modules today."""
    res = subprocess.run(
        [sys.executable, "-m", "tools.arguments.generate", "--check", "--reference", str(REFERENCE)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-2000:]


def test_every_megatron_and_relax_flag_is_a_field() -> None:
    assert len(MEGATRON) > 600 and len(RELAX) > 300
    missing = [
        f"{source}:{flag}"
        for source, table in (("megatron", MEGATRON), ("relax", RELAX))
        for entry in table.values()
        for flag in entry["flags"]
        if field_for_flag(flag) is None
    ]
    assert not missing


def test_megatron_fields_take_megatron_types_arity_and_choices() -> None:
    s = _spec(
        "--no-rope-fusion",
        "--use-rotary-position-embeddings",
        "--moe-layer-freq",
        "([0]*3+[1]*58)",
        "--moe-router-dtype",
        "fp32",
        "--moe-token-drop-policy",
        "probs",
        "--moe-aux-loss-coeff",
        "1e-3",
        "1e-4",
        "--optimizer",
        "muon",
        "--ckpt-format",
        "torch_dcp",
        "--train-iters",
        "20",
        "--log-interval",
        "1",
        "--multi-latent-attention",
        "--q-lora-rank",
        "1536",
        "--kv-lora-rank",
        "512",
        "--qk-head-dim",
        "128",
        "--v-head-dim",
        "128",
        "--no-gradient-accumulation-fusion",
        "--recompute-modules",
        "--rampup-batch-size",
        "16",
        "8",
        "300",
    )
    assert s.apply_rope_fusion is False and s.use_rotary_position_embeddings is True
    assert s.moe_aux_loss_coeff == [1e-3, 1e-4] and s.optimizer == "muon" and s.ckpt_format == "torch_dcp"
    assert layer_pattern(s.moe_layer_freq) == [0, 0, 0] + [1] * 58
    assert s.gradient_accumulation_fusion is False and s.recompute_modules == []
    assert s.rampup_batch_size == [16, 8, 300] and s.train_iters == 20 and s.q_lora_rank == 1536
    # to_argv() gives the same spec back
    assert normalize(argv=s.to_argv()).spec == s


def test_choices_and_arity_errors_name_the_flag() -> None:
    with pytest.raises(SpecError) as err:
        _spec("--optimizer", "adamw", "--rampup-batch-size", "16", "8")
    codes = {(i.code, i.field) for i in err.value.errors}
    assert ("spec.invalid_choice", "optimizer") in codes
    assert ("argv.missing_value", "rampup-batch-size") in codes
    with pytest.raises(SpecError) as err:
        _spec("--moe-layer-freq", "__import__('os')")
    assert [i.field for i in err.value.errors] == ["moe-layer-freq"]


def test_relax_resets_megatron_defaults() -> None:
    assert FIELDS["lr"].default == 1e-6 and FIELDS["lr"].megatron_default is None
    assert FIELDS["distributed_timeout_minutes"].default == 30
    assert FIELDS["distributed_timeout_minutes"].megatron_default == 10


def test_relax_code_flags_beyond_the_reference() -> None:
    s = _spec(
        "--ref-actor-config",
        '{"tp": 2}',
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "2",
        "--use-wandb",
        "--wandb-project",
        "p",
        "--warm-hf-checkpoint-page-cache",
        "--enable-mtp-training",
        "--mtp-num-layers",
        "1",
        "--opd-kl-type",
        "low_var_kl",
        "--teacher-sglang-mem-fraction-static",
        "0.5",
        "--use-agentic-rollout",
        "--agent-command",
        "python agent.py",
        "--agent-cwd",
        "/work",
    )
    assert s.ref_actor_config == {"tp": 2} and s.actor_num_gpus_per_node == 2 and s.use_wandb
    assert s.teacher_sglang == {"mem_fraction_static": 0.5} and s.opd_kl_type == "low_var_kl"
    assert normalize(argv=s.to_argv()).spec == s


def test_flags_of_later_megatron_versions_are_refused_with_the_reason() -> None:
    for flag in NOT_AT_PINNED_MEGATRON:
        (issue,) = decode_argv([f"--{flag}"]).issues
        assert issue.code == "spec.unknown_key" and "3714d81" in issue.message


def test_store_false_flags_as_object_keys() -> None:
    base = {
        "rollout-batch-size": 8,
        "hf-checkpoint": "/m",
        "prompt-data": "/d.jsonl",
        "num-rollout": 2,
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
    }
    assert normalize(obj={**base, "no-rope-fusion": True}).spec.apply_rope_fusion is False
    assert normalize(obj={**base, "apply_rope_fusion": False}).spec.apply_rope_fusion is False
    assert normalize(obj={**base, "disable-bias-linear": False}).spec.add_bias_linear is True
    with pytest.raises(SpecError) as err:
        normalize(obj={**base, "no-rope-fusion": "yes"})
    assert err.value.errors[0].field == "no-rope-fusion"


def test_layer_pattern_is_folded_without_eval() -> None:
    assert layer_pattern("[1]*4") == [1, 1, 1, 1]
    assert layer_pattern("([1]*3+[0]*1)*2") == [1, 1, 1, 0, 1, 1, 1, 0]
    assert layer_pattern("4") == 4 and layer_pattern(2) == 2
    for bad in ("[1]*10**9", "__import__('os')", "[1]*(2*99999999)", "[a]"):
        with pytest.raises((ValueError, SyntaxError)):
            layer_pattern(bad)


def test_reference_fields_agree_with_relax_code() -> None:
    """A reference parameter that Relax's code also defines has the code's kind, flags, default, choices
    and arity, unless FIELD_DEVIATIONS says why not."""
    by_flag = {flag: e for e in RELAX.values() for flag in e["flags"]}
    disagree = {}
    for name, f in FIELDS.items():
        entry = by_flag.get(f.flag)
        if f.source != "reference" or entry is None:
            continue
        annotation, info = field_from_entry(entry, "relax")
        info.annotation = annotation
        info.json_schema_extra["group"] = f.group  # type: ignore[index]
        code = _field_spec(entry["dest"], info)
        diffs = [
            key
            for key, ours, theirs in (
                ("kind", f.kind, code.kind),
                ("default", f.default, code.default),
                ("choices", set(f.choices or ()), set(code.choices or ())),
                ("switches", set(f.switches), set(code.switches)),
                ("nargs", f.nargs, code.nargs),
            )
            if ours != theirs
        ]
        if diffs:
            disagree[name] = diffs
    assert set(disagree) == set(FIELD_DEVIATIONS), disagree
    assert all(reason.strip() for reason in FIELD_DEVIATIONS.values())
