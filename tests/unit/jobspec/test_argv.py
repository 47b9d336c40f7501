"""The argv codec."""

from __future__ import annotations

from jobspec import normalize
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
    s = spec("--no-offload-train", "--no-scale-weight-sync-precheck")
    assert (s.offload_train, s.scale_weight_sync_precheck) == (False, False)
    assert spec("--no-save-optim").no_save_optim is True  # a flag of its own (Megatron), not a negation
    # store_false flags of Megatron: the flag turns its dest off
    s = spec("--no-rope-fusion", "--disable-bias-linear")
    assert (s.apply_rope_fusion, s.add_bias_linear) == (False, False)
    assert {"--no-rope-fusion", "--disable-bias-linear"} <= set(s.to_argv())
    # a flag of later Megatron-LM versions is refused with the reason
    issue = decode_argv(["--no-use-precision-aware-optimizer"]).issues[0]
    assert issue.code == "spec.unknown_key" and "3714d81" in issue.message
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
