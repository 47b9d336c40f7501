"""Parameter groups for evaluation, rewards, generative reward models and on-policy distillation."""

from __future__ import annotations

from typing import Any, Literal

from jobspec.arguments import megatron
from jobspec.fields import ParamGroup, param

__all__ = ["EvalParams", "RewardParams", "GenRMParams", "OpdParams"]


class EvalParams(ParamGroup):
    group = "eval"
    title = "Evaluation"

    eval_interval = megatron(help="Evaluate every N rollout rounds.", ge=1)
    eval_prompt_data: list[str] | None = param(
        None,
        "Evaluation datasets as name/path pairs: --eval-prompt-data aime /data/aime.jsonl gsm8k "
        "/data/gsm8k.jsonl. A single path is read as the dataset 'aime' (Relax's legacy form).",
        path_kind="input",
        path_layout="name_path_pairs",
        min_length=1,
    )
    eval_config: str | None = param(
        None,
        "OmegaConf YAML/JSON evaluation config file; overrides --eval-prompt-data when set.",
        path_kind="input",
    )
    eval_function_path: str | None = param(
        None, "Evaluation generation function.", function_path=True, unset="rollout_function_path"
    )
    skip_eval_before_train: bool = param(False, "Skip the evaluation before training starts.")
    eval_input_key: str | None = param(None, "Input key of the evaluation data.", unset="input_key")
    eval_label_key: str | None = param(None, "Label key of the evaluation data.")
    eval_tool_key: str | None = param(None, "Tools key of the evaluation data.")
    n_samples_per_eval_prompt: int = param(1, "Samples per evaluation prompt.", ge=1)
    eval_temperature: float | None = param(None, "Sampling temperature for evaluation.", ge=0)
    eval_top_p: float | None = param(None, "Top-p for evaluation.", gt=0, le=1)
    eval_top_k: int | None = param(None, "Top-k for evaluation.", ge=-1)
    eval_max_response_len: int | None = param(None, "Maximum response length for evaluation.", ge=1)
    eval_max_prompt_len: int | None = param(None, "Maximum prompt length for evaluation.", ge=1)
    eval_min_new_tokens: int | None = param(None, "Minimum new tokens generated in evaluation.", ge=0)
    eval_max_context_len: int | None = param(
        None, "Maximum context length for evaluation.", ge=2, unset="rollout_max_context_len"
    )


class RewardParams(ParamGroup):
    group = "reward"
    title = "Reward"

    rm_type: str | None = param(None, "Built-in reward type (e.g. math, dapo, remote_rm).")
    rm_type_fallback: str | None = param(
        None,
        "Fallback for unknown or missing reward types: 'zero' scores 0 with a warning, a registered name "
        "routes to that reward; unset keeps raising an error.",
    )
    rm_type_infer: bool = param(
        False,
        "Infer the reward type from the registered label matchers when no type is given; an explicit type "
        "wins (with a warning) on conflict.",
    )
    custom_rm_path: str | None = param(
        None,
        "Custom reward function. A per-sample function gets one sample; a batch/group function gets the "
        "whole list and returns one result per sample. Bypasses format-aware routing.",
        function_path=True,
    )
    reward_max_concurrency: int = param(
        64,
        "Maximum concurrent reward calls per calling process; a custom batch/group call counts as one.",
        ge=1,
    )
    reward_num_workers: int = param(
        16, "Ray actors that run synchronous rewards (asynchronous custom rewards do not use them).", ge=1
    )
    reward_key: str | None = param(None, "Key of the reward value when the reward function returns a dict.")
    eval_reward_key: str | None = param(None, "Reward key for evaluation.", unset="reward_key")
    group_rm: bool = param(False, "Compute rewards for a whole group at once.")
    rm_url: str | None = param(None, "URL of a remote reward model service (for --rm-type remote_rm).")
    custom_reward_post_process_path: str | None = param(
        None, "Custom reward post-processing function (default: GRPO normalization).", function_path=True
    )
    custom_convert_samples_to_train_data_path: str | None = param(
        None,
        "Custom conversion of samples to training data: def convert_samples_to_train_data(args, samples) -> dict.",
        function_path=True,
    )


class GenRMParams(ParamGroup):
    group = "genrm"
    title = "GenRM (generative reward model)"

    genrm_model_path: str | None = param(
        None, "GenRM model path; setting it enables GenRM.", path_kind="input"
    )
    genrm_num_gpus: int = param(1, "Total GPUs for GenRM.", ge=1)
    genrm_num_gpus_per_engine: int = param(1, "GPUs per GenRM engine.", ge=1)
    genrm_engine_config: dict[str, Any] | None = param(
        None,
        "GenRM engine initialisation arguments (JSON). Example: "
        '\'{"dp_size": 1, "pp_size": 1, "max_total_tokens": 8192}\'.',
    )
    genrm_sampling_config: dict[str, Any] | None = param(
        None,
        "GenRM sampling parameters (JSON). Keys: temperature (default 0.1), top_p (1.0), top_k (-1), "
        "max_response_len (4096).",
    )


class OpdParams(ParamGroup):
    group = "opd"
    title = "On-policy distillation (OPD)"

    use_opd: bool = param(False, "Enable on-policy distillation; needs --opd-type.")
    teacher_sglang: dict[str, Any] = param(
        {},
        "SGLang server arguments of a Relax-managed OPD teacher, passed through as --teacher-sglang-<name> "
        "(stored without the prefix, untyped like --sglang-*). Example: --teacher-sglang-mem-fraction-static "
        "0.5.",
        kind="passthrough",
        flag="teacher-sglang-*",
    )
    opd_type: Literal["sglang", "megatron"] | None = param(
        None,
        "OPD teacher source. sglang: teacher log-probs come from an external SGLang server (--rm-url); "
        "megatron: the teacher is loaded from --opd-teacher-load.",
    )
    opd_kl_coef: float = param(1.0, "OPD KL penalty coefficient.", ge=0)
    opd_teacher_load: str | None = param(
        None, "Teacher checkpoint path; required with --opd-type megatron.", path_kind="input"
    )
    opd_teacher_ckpt_step: int | None = param(None, "Teacher checkpoint step.", ge=0)
