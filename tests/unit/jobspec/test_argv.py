"""The argv codec and the launch-script reader."""

from __future__ import annotations

import pytest

from jobspec import SpecError, normalize, parse_launch_script, scan_launch_script
from jobspec.argv import decode_argv

REQUIRED = [
    "--hf-checkpoint",
    "/m",
    "--prompt-data",
    "/d.jsonl",
    "--num-rollout",
    "3",
    "--colocate",
    "--rollout-batch-size",
    "8",
]


def spec(*flags: str):
    return normalize(argv=[*REQUIRED, *flags]).spec


def codes(argv: list[str]) -> dict[str, str]:
    return {i.code: i.severity for i in decode_argv(argv).issues}


def test_value_forms_space_and_equals() -> None:
    assert spec("--lr", "2e-5").lr == spec("--lr=2e-5").lr == 2e-5
    assert spec("--rollout-top-k=-1").rollout_top_k == -1
    assert spec("--rollout-top-k", "-1").rollout_top_k == -1  # a negative number is a value, not a flag
    assert spec("--system-prompt=--weird").system_prompt == "--weird"
    assert spec("--system-prompt", "").system_prompt == ""


def test_lists_take_every_value_up_to_the_next_flag() -> None:
    s = spec(
        "--rollout-stop",
        "</answer>",
        "<|im_end|>",
        "--rollout-stop-token-ids",
        "151643",
        "151645",
        "--seed",
        "1",
    )
    assert s.rollout_stop == ["</answer>", "<|im_end|>"] and s.rollout_stop_token_ids == [151643, 151645]
    s = spec("--eval-prompt-data", "aime", "/d/aime.jsonl", "gsm8k", "/d/gsm8k.jsonl")
    assert s.eval_prompt_data == ["aime", "/d/aime.jsonl", "gsm8k", "/d/gsm8k.jsonl"]
    assert codes(["--rollout-stop"]) == {"argv.missing_value": "error"}


def test_json_flags() -> None:
    s = spec(
        "--resource",
        '{"actor":[1,1],"rollout":[1,1]}',
        "--apply-chat-template-kwargs",
        '{"enable_thinking": false}',
    )
    assert s.resource == {"actor": [1, 1], "rollout": [1, 1]}
    assert s.apply_chat_template_kwargs == {"enable_thinking": False}
    issues = decode_argv(["--resource", "{actor: [1, 1]}"]).issues
    assert issues[0].code == "spec.invalid_json" and issues[0].field == "resource"


def test_boolean_flags() -> None:
    s = spec("--use-kl-loss", "--kl-loss-coef", "0.01", "--ref-load", "/r")
    assert s.use_kl_loss is True
    assert codes(["--use-kl-loss", "true"]) == {"argv.unexpected_value": "error"}
    assert codes(["--use-kl-loss=1"]) == {"argv.unexpected_value": "error"}


def test_no_prefix_only_where_relax_declares_it() -> None:
    s = spec("--no-offload-train", "--no-scale-weight-sync-precheck", "--no-use-precision-aware-optimizer")
    assert (s.offload_train, s.scale_weight_sync_precheck, s.use_precision_aware_optimizer) == (
        False,
        False,
        False,
    )
    assert spec("--no-save-optim").no_save_optim is True  # a flag of its own (Megatron), not a negation
    issue = decode_argv(["--no-colocate"]).issues[0]
    assert issue.code == "spec.unknown_key" and issue.field == "no-colocate"


def test_bool_value_flag_follows_relax_type_bool() -> None:
    assert spec("--polling-mode=").polling_mode is False
    assert spec("--polling-mode", "true").polling_mode is True
    decoded = decode_argv(["--polling-mode", "False"])
    assert decoded.values["polling_mode"] is False
    assert decoded.issues[0].code == "argv.bool_value_quirk" and decoded.issues[0].severity == "warning"
    assert "--polling-mode=" in normalize(argv=[*REQUIRED, "--polling-mode="]).spec.to_argv()


def test_flag_aliases() -> None:
    assert decode_argv(["--custom-dataset-class", "pkg.DS"]).values == {"custom_dataset_class_path": "pkg.DS"}


def test_repeated_flag_last_wins_with_warning() -> None:
    decoded = decode_argv(["--seed", "1", "--seed", "2"])
    assert decoded.values["seed"] == 2 and decoded.issues[0].code == "argv.repeated_flag"


def test_syntax_errors() -> None:
    assert codes(["stray"]) == {"argv.unexpected_token": "error"}
    assert codes(["--seed"]) == {"argv.missing_value": "error"}
    assert codes(["--seed", "1", "2"]) == {"argv.unexpected_value": "error"}
    assert codes(["--seed", "--lr", "1"]) == {"argv.missing_value": "error"}


def test_sglang_passthrough_argv() -> None:
    s = spec(
        "--sglang-mem-fraction-static",
        "0.7",
        "--sglang-cuda-graph-bs",
        "1",
        "2",
        "4",
        "--sglang-enable-torch-compile",
        "--sglang-log-level=warning",
    )
    assert s.sglang == {
        "mem_fraction_static": 0.7,
        "cuda_graph_bs": [1, 2, 4],
        "enable_torch_compile": True,
        "log_level": "warning",
    }


def test_to_argv_only_non_defaults_and_round_trip() -> None:
    s = spec("--lr", "1e-5", "--rollout-stop", "a b", "--resource", '{"actor":[1,2],"rollout":[1,2]}')
    argv = s.to_argv()
    assert "--seed" not in argv and "--lr" in argv and argv[argv.index("--rollout-stop") + 1] == "a b"
    assert normalize(argv=argv).spec == s
    assert normalize(obj=s.to_dict()).spec == s


SCRIPT = r"""#!/bin/bash
set -euxo pipefail
# Qwen3 GRPO
BASE=/data
MODEL_ARGS=(
   --num-layers 36
   --hidden-size 2560   # comment after a value
   --swiglu
)
CKPT_ARGS=(
   --hf-checkpoint ${BASE}/Qwen3-4B
   --ref-load "${BASE}/Qwen3-4B_torch_dist"
)
ROLLOUT_ARGS=(
   --prompt-data "$BASE/dapo math.jsonl"
   --rollout-batch-size 32
   --rollout-stop "</answer>" '<|im_end|>'
   --num-rollout ${NUM_ROLLOUT:-100}
)
ROLLOUT_ARGS+=(--n-samples-per-prompt 8)
export RUNTIME_ENV_JSON="{\"env_vars\": {\"PYTHONPATH\": \"/root/Megatron-LM\"}}"
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 relax/entrypoints/train.py \
   --resource '{"actor": [1, 8], "rollout": [1, 8]}' \
   --colocate \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   --sglang-mem-fraction-static 0.7 \
   "$@" 2>&1 | tee log.txt
"""


def test_launch_script_arrays_continuations_and_quotes() -> None:
    argv = parse_launch_script(SCRIPT, args=["--seed", "7"])
    assert argv == [
        "--resource",
        '{"actor": [1, 8], "rollout": [1, 8]}',
        "--colocate",
        "--num-layers",
        "36",
        "--hidden-size",
        "2560",
        "--swiglu",
        "--hf-checkpoint",
        "/data/Qwen3-4B",
        "--ref-load",
        "/data/Qwen3-4B_torch_dist",
        "--prompt-data",
        "/data/dapo math.jsonl",
        "--rollout-batch-size",
        "32",
        "--rollout-stop",
        "</answer>",
        "<|im_end|>",
        "--num-rollout",
        "100",
        "--n-samples-per-prompt",
        "8",
        "--sglang-mem-fraction-static",
        "0.7",
        "--seed",
        "7",
    ]
    s = normalize(argv=argv).spec
    assert s.num_layers == 36 and s.swiglu and s.sglang == {"mem_fraction_static": 0.7} and s.seed == 7


def test_launch_script_env_overrides_defaults() -> None:
    argv = parse_launch_script(SCRIPT, env={"NUM_ROLLOUT": "5"})
    assert argv[argv.index("--num-rollout") + 1] == "5"


def test_launch_script_python_module_form() -> None:
    text = "python3 -m relax.entrypoints.train --rollout-batch-size 4 --lr=1e-6 > out.log\n"
    assert parse_launch_script(text) == ["--rollout-batch-size", "4", "--lr=1e-6"]
    assert parse_launch_script("cd x && python train.py --seed 3 ; echo done") == ["--seed", "3"]


def test_launch_script_unresolved_variable_names_the_flag() -> None:
    text = "source ./models/qwen.sh\npython train.py --hf-checkpoint ${MODEL_DIR}/qwen --save $(date +%s)\n"
    scanned = scan_launch_script(text)
    by_code = {i.code: i for i in scanned.issues}
    issue = by_code["script.unresolved_variable"]
    assert (
        issue.field == "hf-checkpoint"
        and "MODEL_DIR" in issue.message
        and "./models/qwen.sh" in issue.message
    )
    assert by_code["script.command_substitution"].field == "save"
    with pytest.raises(SpecError) as info:
        parse_launch_script(text)
    assert {i.field for i in info.value.errors} == {"hf-checkpoint", "save"}


def test_launch_script_unresolved_array_is_reported_without_a_flag() -> None:
    scanned = scan_launch_script('python train.py --colocate "${MODEL_ARGS[@]}" --seed 1\n')
    (issue,) = scanned.issues
    assert (
        issue.code == "script.unresolved_variable" and issue.field is None and "MODEL_ARGS" in issue.message
    )


def test_launch_script_conditional_assignment_is_not_applied() -> None:
    text = 'ARGS=(--seed 1)\nif [ "$X" = 1 ]; then\n  ARGS+=(--colocate)\nfi\npython train.py "${ARGS[@]}"\n'
    scanned = scan_launch_script(text)
    assert scanned.argv == ["--seed", "1"]
    assert [i.code for i in scanned.issues] == ["script.conditional_assignment"]


def test_launch_script_without_entrypoint() -> None:
    with pytest.raises(SpecError) as info:
        parse_launch_script("echo hello\n")
    assert info.value.errors[0].code == "script.no_entrypoint"


NESTED = r"""
MODEL_DIR="${MODEL_DIR:?Set MODEL_DIR first}"
EXP="${EXP_NAME:-run-$(date +%s)}"
CKPT_ARGS=(--hf-checkpoint "${MODEL_DIR}/qwen" --megatron-to-hf-mode bridge)
EVAL_ARGS=()
if [ "${EVAL:-0}" -gt 0 ]; then
    EVAL_ARGS+=(--eval-interval 5)
fi
ray job submit ${WORKING_DIR:+--working-dir "${WORKING_DIR}"} -- python3 -m relax.entrypoints.train \
    "${CKPT_ARGS[@]}" "${EVAL_ARGS[@]}" --tb-experiment-name "${EXP}"
"""


def test_launch_script_taint_follows_values_into_the_command() -> None:
    scanned = scan_launch_script(NESTED)
    assert scanned.argv[2:4] == ["--megatron-to-hf-mode", "bridge"]
    found = {(i.code, i.field) for i in scanned.issues}
    assert found == {
        ("script.unresolved_variable", "hf-checkpoint"),
        ("script.command_substitution", "tb-experiment-name"),
        ("script.conditional_assignment", None),
    }
    scanned = scan_launch_script(NESTED, env={"MODEL_DIR": "/m", "EXP_NAME": "exp1"})
    assert scanned.argv == [
        "--hf-checkpoint",
        "/m/qwen",
        "--megatron-to-hf-mode",
        "bridge",
        "--tb-experiment-name",
        "exp1",
    ]
    assert [i.code for i in scanned.issues] == ["script.conditional_assignment"]
