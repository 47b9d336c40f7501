"""SGLang wire schemas: request normalisation, finish reasons, response shapes, tensor payloads (no model)."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.rollout.engine import FinishReason, SamplingParams
from runtime.rollout.sglang.client import _error_message, codec_for, engine_url
from runtime.rollout.sglang.engine_actor import row_seed
from runtime.rollout.sglang.protocol import (
    Finish,
    FinishType,
    GenerationOutput,
    GenerationRequest,
    ProtocolError,
    RequestSampling,
    SGLangGeneration,
    batch_seed,
    generate_response,
    normalize_generate,
    parse_generate_outputs,
    parse_sampling_params,
    to_sglang_sampling_params,
)
from runtime.rollout.sglang.serving import _resolve_finish
from runtime.rollout.sglang.tensor_payload import (
    RELAX_SAFETENSORS_FORMAT,
    SafetensorsCodec,
    SGLangIpcCodec,
    bucket_named_tensors,
    decode_named_tensors,
    encode_named_tensors,
)
from runtime.types import SampleStatus


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


# -- sampling params ----------------------------------------------------------------------------------------


def test_sampling_defaults_are_sglangs() -> None:
    sampling, n = parse_sampling_params(None)
    assert n == 1
    assert sampling == RequestSampling(max_new_tokens=128, skip_special_tokens=True, top_k=0, temperature=1.0)
    assert not sampling.greedy


@pytest.mark.parametrize("temperature", [0, 0.0, 1e-7])
def test_temperature_zero_is_greedy_with_temperature_one(temperature: float) -> None:
    sampling, _ = parse_sampling_params({"temperature": temperature, "top_k": 50})
    assert sampling.greedy and sampling.top_k == 1 and sampling.logprob_temperature == 1.0


@pytest.mark.parametrize("top_k", [-1, 1 << 30, None])
def test_top_k_whole_vocabulary_is_off(top_k: int | None) -> None:
    assert parse_sampling_params({"top_k": top_k})[0].top_k == 0


def test_sampling_fields_map_through() -> None:
    sampling, n = parse_sampling_params(
        {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "max_new_tokens": 9,
            "min_new_tokens": 2,
            "stop": "\n",
            "stop_token_ids": [5, 3, 5],
            "ignore_eos": True,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "n": 4,
            "sampling_seed": 11,
            "stream_interval": 3,  # accepted, ignored
        }
    )
    assert n == 4
    assert sampling == RequestSampling(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        max_new_tokens=9,
        min_new_tokens=2,
        stop_token_ids=(3, 5),
        ignore_eos=True,
        stop=("\n",),
        skip_special_tokens=False,
        no_stop_trim=True,
        seed=11,
    )
    assert sampling.logprob_temperature == 0.7


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": -1}, "temperature must be a non-negative"),
        ({"top_p": 0}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"min_p": 2}, "min_p must be in [0, 1]"),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0"),
        ({"max_new_tokens": 3, "min_new_tokens": 4}, "min_new_tokens must be in [0, max_new_tokens(3)]"),
        ({"frequency_penalty": 0.5}, "sampling_params.frequency_penalty is not supported"),
        ({"repetition_penalty": 1.1}, "sampling_params.repetition_penalty is not supported"),
        ({"regex": "a+"}, "sampling_params.regex is not supported"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ],
)
def test_bad_sampling_params_are_refused_by_name(params: dict, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_sampling_params(params)
    assert message in str(info.value)


def test_neutral_values_of_unsupported_fields_are_accepted() -> None:
    parse_sampling_params(
        {"frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": None, "regex": None}
    )


# -- generate request normalisation ----------------------------------------------------------------------


def test_single_text_request() -> None:
    norm = normalize_generate({"text": "ab", "rid": "r1", "return_logprob": True}, encode)
    assert norm.is_single
    [req] = norm.requests
    assert (req.rid, req.input_ids, req.return_logprob, req.logprob_start_len, req.top_logprobs_num) == (
        "r1",
        [97, 98],
        True,
        -1,
        0,
    )


def test_batch_of_input_ids_with_string_rid_gets_indexed_rids() -> None:
    norm = normalize_generate({"input_ids": [[1, 2], [3]], "rid": "job"}, None)
    assert not norm.is_single
    assert [r.rid for r in norm.requests] == ["job_0", "job_1"]
    assert [r.input_ids for r in norm.requests] == [[1, 2], [3]]


def test_n_expands_prompt_major_with_child_rids() -> None:
    norm = normalize_generate(
        {"input_ids": [[1], [2]], "rid": ["a", "b"], "sampling_params": {"n": 3, "max_new_tokens": 4}}, None
    )
    assert not norm.is_single
    assert [r.input_ids for r in norm.requests] == [[1]] * 3 + [[2]] * 3
    assert [r.logical_rid for r in norm.requests] == ["a"] * 3 + ["b"] * 3
    assert all(r.rid.startswith(f"{r.logical_rid}_") for r in norm.requests)
    assert len({r.rid for r in norm.requests}) == 6


def test_single_prompt_with_n_becomes_a_batch() -> None:
    norm = normalize_generate({"input_ids": [1, 2], "sampling_params": {"n": 2}}, None)
    assert not norm.is_single and len(norm.requests) == 2


def test_per_item_sampling_and_logprob_params() -> None:
    norm = normalize_generate(
        {
            "input_ids": [[1], [2]],
            "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}],
            "return_logprob": [True, False],
            "logprob_start_len": [0, -1],
            "top_logprobs_num": 2,
        },
        None,
    )
    assert [r.sampling.max_new_tokens for r in norm.requests] == [1, 2]
    assert [r.return_logprob for r in norm.requests] == [True, False]
    assert [r.logprob_start_len for r in norm.requests] == [0, -1]
    assert [r.top_logprobs_num for r in norm.requests] == [2, 2]
    # rows that differ only in max_new_tokens (or stop strings) batch together
    assert norm.requests[0].sampling.batch_key() == norm.requests[1].sampling.batch_key()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either text or input_ids"),
        ({"text": "a", "input_ids": [1]}, "Either text or input_ids"),
        ({"input_ids": []}, "input_ids cannot be empty"),
        ({"input_ids": [[1], []]}, "prompt 1 has no tokens"),
        ({"input_ids": [1, 999]}, "outside [0, 100)"),
        (
            {"input_ids": [[1], [2]], "sampling_params": [{}]},
            "sampling_params should be equal to the batch size",
        ),
        ({"input_ids": [[1], [2]], "sampling_params": [{"n": 1}, {"n": 2}]}, "parallel_sample_num"),
        ({"input_ids": [[1], [2]], "rid": ["x"]}, "rids length mismatch"),
        ({"input_ids": [[1], [2]], "rid": ["x", "x"]}, "Duplicate request IDs"),
        ({"input_ids": [1], "stream": True}, "stream=true is not supported"),
        ({"input_ids": [1], "image_data": "x.png"}, "image_data is not supported"),
        ({"input_ids": [1], "lora_path": "l"}, "lora_path is not supported"),
        ({"input_ids": [[1]], "sampling_params": {"n": 2}, "return_logprob": [True]}, "Cannot use list"),
    ],
)
def test_bad_generate_requests_are_refused(body: dict, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        normalize_generate(body, encode, vocab_size=100)
    assert message in str(info.value)


def test_text_needs_a_tokenizer() -> None:
    with pytest.raises(ProtocolError, match="needs a tokenizer"):
        normalize_generate({"text": "a"}, None)


def test_unknown_generate_fields_are_ignored() -> None:
    norm = normalize_generate({"input_ids": [1], "log_metrics": False, "priority": 3}, None)
    assert len(norm.requests) == 1


# -- seeds ------------------------------------------------------------------------------------------------


def test_batch_seed() -> None:
    assert batch_seed([None, None]) is None
    assert batch_seed([7, 7, 7]) == 7
    mixed = batch_seed([7, 8])
    assert mixed == batch_seed([7, 8]) and mixed != batch_seed([8, 7]) and 0 <= mixed < 1 << 63


def test_row_seeds_do_not_collide_across_engines() -> None:
    # RolloutGroup gives engine i the seed s + i; row seeds of engine 0 and engine 1 must differ
    engine0 = {row_seed(100, row) for row in range(512)}
    engine1 = {row_seed(101, row) for row in range(512)}
    assert len(engine0) == 512 and not engine0 & engine1


# -- finish reasons and responses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "wire"),
    [
        (Finish.stop_token(2), {"type": "stop", "matched": 2}),
        (Finish.stop_string("\n\n"), {"type": "stop", "matched": "\n\n"}),
        (Finish.max_length(16), {"type": "length", "length": 16}),
        (Finish.abort("gone"), {"type": "abort", "message": "gone", "status_code": None, "err_type": None}),
    ],
)
def test_finish_reason_wire_format_round_trips(finish: Finish, wire: dict) -> None:
    assert finish.to_json() == wire
    assert Finish.from_json(json.loads(json.dumps(wire))) == finish


def test_finish_maps_to_sample_status() -> None:
    assert Finish.stop_token(0).sample_status is SampleStatus.COMPLETED
    assert Finish.max_length(1).sample_status is SampleStatus.TRUNCATED
    assert Finish.abort().sample_status is SampleStatus.ABORTED


def _output(**overrides: object) -> GenerationOutput:
    values: dict = {
        "rid": "r",
        "prompt_tokens": 3,
        "output_ids": [7, 2],
        "output_logprobs": [-0.5, -1.5],
        "finish": Finish.stop_token(2),
        "text": "x",
        "e2e_latency": 0.25,
    }
    values.update(overrides)
    return GenerationOutput(**values)  # type: ignore[arg-type]


def test_generate_response_shape_without_logprobs() -> None:
    response = generate_response(
        _output(weight_version="4"), GenerationRequest("r", [1, 2, 3], RequestSampling())
    )
    assert list(response) == ["text", "output_ids", "meta_info"]
    assert response["meta_info"] == {
        "id": "r",
        "finish_reason": {"type": "stop", "matched": 2},
        "prompt_tokens": 3,
        "weight_version": "4",
        "completion_tokens": 2,
        "cached_tokens": 0,
        "e2e_latency": 0.25,
    }


def test_generate_response_logprob_entries() -> None:
    out = _output(
        output_logprobs=[-0.5, float("-inf")],
        output_top_logprobs=[[(-0.1, 9), (-0.5, 7)], [(-0.2, 3), (float("nan"), 2)]],
        input_logprobs=[None, -2.0],
        input_ids_for_logprobs=[2, 3],
        input_top_logprobs=[None, [(-1.0, 3)]],
    )
    request = GenerationRequest(
        "r",
        [1, 2, 3],
        RequestSampling(),
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    meta = generate_response(out, request, token_text=lambda t: f"<{t}>")["meta_info"]
    assert meta["output_token_logprobs"] == [[-0.5, 7, "<7>"], [None, 2, "<2>"]]  # -inf -> null (JSON)
    assert meta["output_token_logprobs_length"] == 2
    assert meta["input_token_logprobs"] == [[None, 2, "<2>"], [-2.0, 3, "<3>"]]
    assert meta["output_top_logprobs"][1] == [[-0.2, 3, "<3>"], [None, 2, "<2>"]]
    assert meta["input_top_logprobs"] == [None, [[-1.0, 3, "<3>"]]]
    json.dumps(meta, allow_nan=False)


def test_skip_tokenizer_init_output_has_no_text() -> None:
    response = generate_response(_output(text=None), GenerationRequest("r", [1], RequestSampling()))
    assert "text" not in response


# -- client side -------------------------------------------------------------------------------------------


def test_parse_generate_outputs_takes_tokens_from_logprob_entries() -> None:
    wire = [
        {
            "text": "hi",
            "output_ids": [5, 0],
            "meta_info": {
                "id": "a",
                "finish_reason": {"type": "stop", "matched": 0},
                "prompt_tokens": 2,
                "weight_version": "3",
                "output_token_logprobs": [[-0.1, 5, None], [-0.2, 0, None]],
            },
        },
        {"output_ids": [1], "meta_info": {"id": "b", "finish_reason": {"type": "length", "length": 1}}},
    ]
    first, second = parse_generate_outputs(wire)
    assert (first.token_ids, first.log_probs, first.status, first.weight_version) == (
        [5, 0],
        [-0.1, -0.2],
        SampleStatus.COMPLETED,
        "3",
    )
    result = first.to_generation_result(default_weight_version=9)
    assert (result.token_ids, result.finish_reason, result.weight_version) == ([5, 0], FinishReason.STOP, 3)
    assert second.status is SampleStatus.TRUNCATED and second.log_probs == [] and second.text is None


def test_weight_version_that_is_not_an_int_falls_back() -> None:
    gen = SGLangGeneration("a", [1], "x", [-1.0], Finish.max_length(1), 1, "default")
    assert gen.to_generation_result(default_weight_version=5).weight_version == 5


def test_aborted_output_refuses_to_become_a_generation_result() -> None:
    gen = SGLangGeneration("a", [1], "x", [-1.0], Finish.abort("by operator"), 1, "0")
    with pytest.raises(ProtocolError, match="request a was aborted by the engine: by operator"):
        gen.to_generation_result()


def test_disagreeing_token_lists_are_an_error() -> None:
    with pytest.raises(ProtocolError, match="disagree"):
        SGLangGeneration.from_json(
            {
                "output_ids": [1, 2],
                "meta_info": {
                    "finish_reason": {"type": "length"},
                    "output_token_logprobs": [[-1.0, 3, None]],
                },
            }
        )


def test_engine_sampling_params_to_sglang() -> None:
    params = SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=5,
        stop_token_ids=(4,),
        stop=("##",),
        min_new_tokens=1,
    )
    assert to_sglang_sampling_params(params, seed=3, skip_special_tokens=False) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 5,
        "skip_special_tokens": False,
        "stop_token_ids": [4],
        "stop": ["##"],
        "min_new_tokens": 1,
        "sampling_seed": 3,
    }
    # and our server reads it back as the same sampling
    sampling, _ = parse_sampling_params(to_sglang_sampling_params(params))
    assert sampling.greedy and sampling.max_new_tokens == 5 and sampling.stop == ("##",)


def test_engine_url_and_error_messages() -> None:
    assert engine_url("127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert engine_url("https://h:1/") == "https://h:1"
    import httpx

    assert _error_message(httpx.Response(400, json={"error": {"message": "bad"}})) == "bad"
    assert _error_message(httpx.Response(400, json={"success": False, "message": "no"})) == "no"
    assert _error_message(httpx.Response(400, text="plain\n")) == "plain"


# -- finish resolution of one generated row ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "custom", "limit", "expected"),
    [
        ([5, 6, 0, 0], None, 4, (3, Finish.stop_token(0))),  # EOS ends it (and is kept)
        ([5, 6, 7, 8], None, 4, (4, Finish.max_length(4))),
        ([5, 6, 7, 0], None, 4, (4, Finish.stop_token(0))),  # EOS as the last allowed token is a stop
        ([5, 6, 7, 8, 0], None, 3, (3, Finish.max_length(3))),  # per-row limit below the batch's
        ([5, 6, 0, 0], (2, Finish.stop_string("x")), 4, (2, Finish.stop_string("x"))),
        ([5, 6, 0, 0], (3, Finish.stop_string("x")), 4, (3, Finish.stop_string("x"))),  # same token: string
        ([5, 0, 0, 0], (3, Finish.abort("a")), 4, (2, Finish.stop_token(0))),  # EOS first
        ([5, 6, 7, 8], (1, Finish.abort("a")), 4, (1, Finish.abort("a"))),
    ],
)
def test_resolve_finish(ids: list[int], custom: tuple | None, limit: int, expected: tuple) -> None:
    assert _resolve_finish(ids, {0}, custom, limit) == expected


# -- tensor payloads ---------------------------------------------------------------------------------------


def test_safetensors_payload_round_trips_tied_and_bf16_tensors() -> None:
    embed = torch.randn(6, 4)
    named = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,
        "norm": torch.ones(4, dtype=torch.bfloat16),
    }
    decoded = decode_named_tensors(encode_named_tensors(named))
    assert set(decoded) == set(named)
    for name, tensor in named.items():
        assert decoded[name].dtype == tensor.dtype and torch.equal(decoded[name], tensor)
    codec = SafetensorsCodec()
    assert codec.load_format == RELAX_SAFETENSORS_FORMAT
    entries = codec.encode(list(named.items()), tp_size=2)
    assert len(entries) == 2 and entries[0] == entries[1]


def test_payload_that_is_not_base64_is_refused() -> None:
    with pytest.raises(ValueError, match="not base64"):
        decode_named_tensors("@@@")


def test_buckets_respect_the_byte_limit() -> None:
    named = {f"w{i}": torch.zeros(10) for i in range(5)}  # 40 bytes each
    assert [len(b) for b in bucket_named_tensors(named, 100)] == [2, 2, 1]
    assert [len(b) for b in bucket_named_tensors(named, None)] == [5]
    assert [len(b) for b in bucket_named_tensors({"big": torch.zeros(100)}, 10)] == [1]


def test_codec_follows_the_server() -> None:
    assert isinstance(codec_for({"tensor_load_formats": [RELAX_SAFETENSORS_FORMAT]}), SafetensorsCodec)
    assert isinstance(codec_for({"version": "0.5.17"}), SGLangIpcCodec)


def test_finish_type_values_are_sglangs() -> None:
    assert [t.value for t in FinishType] == ["stop", "length", "abort"]
