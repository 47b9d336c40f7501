"""Parameter groups for training data: datasets, multimodal inputs, SFT."""

from __future__ import annotations

from typing import Any, Literal

from jobspec.fields import ParamGroup, param

__all__ = ["DataParams", "MultimodalParams", "SftParams"]


class DataParams(ParamGroup):
    group = "data"
    title = "Data: datasets"

    prompt_data: str | None = param(None, "Training prompt dataset path.", path_kind="input")
    input_key: str = param("input", "Key of the input field in the dataset.")
    label_key: str | None = param(None, "Key of the label field in the dataset.")
    conversation_key_map: dict[str, str] | None = param(
        None,
        "JSON map that rewrites non-OpenAI conversation messages into the {role, content} shape SFT "
        "expects. One flat map covers both field-name renames (applied to every key of each message, e.g. "
        "from->role, value->content) and role-value renames (applied only to the value of the renamed "
        "'role' field, e.g. human->user, gpt->assistant, so message text is never rewritten). Only used "
        "when --label-key is not set (the --input-key column holds the whole messages list). ShareGPT: "
        '\'{"from":"role","value":"content","human":"user","gpt":"assistant"}\'.',
    )
    metadata_key: str = param("metadata", "Key of the metadata field in the dataset.")
    tool_key: str = param("tools", "Key of the tools field used when applying the chat template.")
    apply_chat_template: bool = param(
        False, "Apply the chat template to the input, treated as OpenAI-format messages."
    )
    apply_chat_template_kwargs: dict[str, Any] = param(
        {}, "Extra keyword arguments for the chat template (JSON)."
    )
    system_prompt: str | None = param(
        None,
        "Optional system prompt prepended to the user input: the final message is <system_prompt> + "
        "<dataset_prompt>.",
    )
    rollout_shuffle: bool = param(False, "Shuffle the prompt order during rollout.")
    rollout_seed: int = param(42, "Rollout random seed, used to shuffle and sample prompts.")
    use_streaming_dataset: bool = param(False, "Use a streaming dataset to save memory.")
    streaming_buffer_size: int = param(10000, "Buffer size of the streaming dataset.", ge=1)
    prefetch_chunk_size: int = param(
        32,
        "Samples handed to the prefetch thread pool per round. Larger values raise throughput and memory "
        "pressure. Only used with --use-streaming-dataset on multimodal data.",
        ge=1,
    )
    prefetch_max_cached: int = param(
        256,
        "Maximum preloaded samples kept in the prefetch cache; the prefetch thread pauses while it is full. "
        "0 disables prefetching. Only used with --use-streaming-dataset on multimodal data.",
        ge=0,
    )
    prefetch_num_workers: int = param(
        1,
        "Worker threads for I/O-bound media decoding (video/image) in the prefetch buffer. 1 serialises "
        "decoding (safest with FFmpeg's thread-unsafety); higher values add parallelism but can hit EAGAIN "
        "on some platforms. Only used when prefetching is on.",
        ge=1,
    )
    custom_prompt_path: str | None = param(
        None,
        "Dotted import path of a prompt transform called before conversation/multimodal processing. "
        "Signature: def custom_fn(prompt, data: dict) -> prompt. Example: my_package.prompt_utils.add_prefix.",
        function_path=True,
    )
    data_source_path: str = param(
        "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer",
        "Class path of the rollout data source.",
        function_path=True,
    )
    start_rollout_id: int | None = param(
        None,
        "First rollout step. When unset, Relax reads it from the checkpoint given by --load.",
        ge=0,
        unset="read from the --load checkpoint (0 when starting fresh)",
    )


class MultimodalParams(ParamGroup):
    group = "multimodal"
    title = "Data: multimodal"

    multimodal_keys: dict[str, str] | None = param(
        None, 'Multimodal field mapping (JSON). Example: \'{"image": "image_key"}\'.'
    )
    use_audio_in_video: bool = param(False, "Also process the audio track of videos.")
    image_max_token_num: int | None = param(None, "Maximum tokens per image.", ge=1, unset="16384")
    image_min_token_num: int | None = param(None, "Minimum tokens per image.", ge=1, unset="4")
    video_min_token_num: int | None = param(None, "Minimum tokens per video frame.", ge=1, unset="128")
    video_max_token_num: int | None = param(None, "Maximum tokens per video frame.", ge=1, unset="768")
    video_fps: float | None = param(None, "Target FPS for video processing.", gt=0, unset="2.0")
    video_fps_min_frames: int | None = param(None, "Minimum frames per video.", ge=1, unset="4")
    video_fps_max_frames: int | None = param(None, "Maximum frames per video.", ge=1, unset="768")
    image_resize_scale_factor: int | None = param(
        None,
        "Alignment factor for image resizing. 0 disables alignment.",
        ge=0,
        unset="patch_size * spatial_merge_size (usually 28)",
    )
    audio_sample_rate: int | None = param(None, "Audio sample rate.", ge=1, unset="16000")
    frame_factor: int | None = param(None, "Frame-count alignment factor.", ge=1, unset="2")
    mm_processor_pool_size: int = param(
        0,
        "Multimodal processor pool size. 0 uses a ThreadPoolExecutor; a positive number creates a "
        "ProcessPoolExecutor with that many workers (true parallelism, no GIL contention).",
        ge=0,
    )


class SftParams(ParamGroup):
    group = "sft"
    title = "SFT (only with --loss-type sft)"

    eval_size: float | None = param(
        None,
        "Carve a held-out eval set out of --prompt-data instead of --eval-prompt-data. A value < 1 is a "
        "fraction of the training set (0.05 = 5%); a value >= 1 is a sample count. Rows are split once "
        "with --seed and removed from the training pool, so train and eval never overlap. Mutually "
        "exclusive with --eval-prompt-data.",
        gt=0,
    )
    sft_predict_interval: int | None = param(
        None,
        "Every N rollout steps run generative prediction on the eval set and write "
        "<save>/predict/predictions_step_<rollout_id>.jsonl. Brings up the rollout role (SGLang must be "
        "online). Complements the always-on perplexity eval (--eval-interval). Needs --save and an eval "
        "source (--eval-prompt-data, --eval-config or --eval-size).",
        ge=1,
    )
    sft_prefetch_buffer_size: int = param(
        256,
        "Maximum preloaded samples in the SFT streaming dataset's PrefetchBuffer. 0 disables prefetching "
        "and falls back to batch-level asyncio.gather over the ProcessorPool.",
        ge=0,
    )
    sft_prefetch_chunk_size: int = param(32, "Chunk size dispatched to the SFT prefetch thread pool.", ge=1)
    sft_prefetch_num_workers: int = param(
        4, "Worker threads in the SFT PrefetchBuffer for I/O-bound media decoding.", ge=1
    )
    sft_oversize_strategy: Literal["skip", "keep", "truncate_left", "truncate_right", "custom"] = param(
        "keep",
        "What the SFT producer does with samples longer than one GPU holds (--max-tokens-per-gpu x "
        "--context-parallel-size); each case logs a warning. skip drops the sample; keep passes it "
        "unchanged (may OOM downstream); truncate_left keeps the last `capacity` tokens; truncate_right "
        "keeps the first `capacity` tokens; custom calls --sft-oversize-custom-function-path. Truncating "
        "multimodal samples can misalign multimodal_train_inputs; use custom to trim media too.",
    )
    sft_oversize_custom_function_path: str | None = param(
        None,
        "Required with --sft-oversize-strategy custom: importable function "
        "def truncate(tokens, loss_mask, capacity, idx) -> (tokens, loss_mask) | None; None means skip.",
        function_path=True,
    )
    sft_async_prepack: bool = param(
        False,
        "Prepack SFT micro-batches asynchronously on CPU (mentioned in the reference's TransferQueue shard "
        "section). Needs --per-rank-fetch, two in-flight steps (--max-staleness >= 1 or "
        "--sft-max-in-flight-steps >= 2), PP=1, CP=1, VPP=1 and the thd QKV format.",
    )
    sft_max_in_flight_steps: int | None = param(
        None,
        "SFT-only depth of the train-step TransferQueue buffer (partitions in flight, current step "
        "included). Maps to --max-staleness = value - 1.",
        ge=1,
    )
    sft_invalid_multimodal_strategy: Literal["error", "skip"] = param(
        "error",
        "What the SFT producer does with samples whose multimodal inputs are invalid: error (default) "
        "or skip. 'skip' makes the remote shard producer fall back to the local path.",
    )
    task_type: str = param(
        "causal_lm",
        "SFT task type: causal_lm (default) or seq_cls (sequence classification; uses the local producer "
        "path).",
    )
    custom_dataset_class_path: str | None = param(
        None,
        "Import path of a custom SFT streaming dataset class (defines from_args(args, *, tokenizer, "
        "processor_pool, pad_token_ids) and the SFTStreamingDataset methods). Relax also accepts it as "
        "--custom-dataset-class.",
        function_path=True,
        aliases=("custom-dataset-class",),
    )
