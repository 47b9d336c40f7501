"""SGLang's native HTTP protocol, the subset we serve and call: request bodies, their normalisation into
per-sample requests, finish reasons, and the `/generate` response shape.

Field names, defaults and shapes follow SGLang 0.5.17 (`sglang/srt/managers/io_struct.py`
`GenerateReqInput`, `sglang/srt/sampling/sampling_params.py`, `schedule_batch.py` finish reasons,
`tokenizer_manager.py` `meta_info`). Pure: no model, no IO; the server and the client both use it.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.rollout.params import FinishReason, GenerationResult, SamplingParams
from runtime.types import SampleStatus

SGLANG_PROTOCOL_VERSION = "0.5.17"  # the SGLang release whose HTTP schemas this module follows
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams.max_new_tokens default in SGLang
_GREEDY_EPS = 1e-6  # SGLang treats 0 <= temperature < 1e-6 as greedy (top_k = 1)
_TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k


class ProtocolError(ValueError):
    """A request SGLang would refuse (or that the built-in engine cannot honour); HTTP 400."""


# -- finish reasons ---------------------------------------------------------------------------------------


class FinishType(StrEnum):
    STOP = "stop"  # a stop token (EOS or stop_token_ids) or a stop string matched
    LENGTH = "length"  # max_new_tokens reached first
    ABORT = "abort"  # /abort_request (or a weight update with abort_all_requests) cut it short


@dataclass(frozen=True)
class Finish:
    """`meta_info.finish_reason`: `{"type": "stop", "matched": <token id | stop string>}`,
    `{"type": "length", "length": N}` or `{"type": "abort", "message": ...}`, as SGLang's
    `FINISH_MATCHED_TOKEN` / `FINISH_MATCHED_STR` / `FINISH_LENGTH` / `FINISH_ABORT` serialise."""

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    @classmethod
    def stop_token(cls, token_id: int) -> Finish:
        return cls(FinishType.STOP, matched=int(token_id))

    @classmethod
    def stop_string(cls, stop: str) -> Finish:
        return cls(FinishType.STOP, matched=stop)

    @classmethod
    def max_length(cls, max_new_tokens: int) -> Finish:
        return cls(FinishType.LENGTH, length=max_new_tokens)

    @classmethod
    def abort(cls, message: str = "Aborted") -> Finish:
        return cls(FinishType.ABORT, message=message)

    def to_json(self) -> dict[str, Any]:
        if self.type is FinishType.STOP:
            return {"type": "stop", "matched": self.matched}
        if self.type is FinishType.LENGTH:
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message, "status_code": None, "err_type": None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Finish:
        if not data:  # SGLang sends null for unfinished (streamed) outputs; a final one always has a reason
            raise ProtocolError("generate output has no finish_reason")
        kind = FinishType(data["type"])
        return cls(kind, matched=data.get("matched"), length=data.get("length"), message=data.get("message"))

    @property
    def sample_status(self) -> SampleStatus:
        return {
            FinishType.STOP: SampleStatus.COMPLETED,
            FinishType.LENGTH: SampleStatus.TRUNCATED,
            FinishType.ABORT: SampleStatus.ABORTED,
        }[self.type]


# -- request bodies ---------------------------------------------------------------------------------------


class SamplingParamsBody(BaseModel):
    """`sampling_params` of `/generate`: SGLang's API fields and defaults. Unknown keys are refused, as
    SGLang's `SamplingParams(**d)` refuses them; `None` means the default, as in SGLang."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = SGLANG_DEFAULT_MAX_NEW_TOKENS
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = -1  # -1 (or SGLang's 1 << 30): the whole vocabulary
    min_p: float | None = 0.0
    min_new_tokens: int | None = 0
    n: int | None = 1
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    spaces_between_special_tokens: bool | None = True  # accepted; the HF tokenizer decides
    no_stop_trim: bool | None = False
    sampling_seed: int | None = None
    stream_interval: int | None = None  # accepted; there is no streaming
    custom_params: dict[str, Any] | None = None  # accepted; there is no custom logit processor
    # Accepted only at their neutral value: the built-in engine does not implement them.
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    logit_bias: dict[str, float] | None = None
    stop_regex: str | list[str] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None


_NEUTRAL_SAMPLING = {
    "frequency_penalty": (None, 0.0),
    "presence_penalty": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "logit_bias": (None, {}),
    "stop_regex": (None, [], ""),
    "json_schema": (None, ""),
    "regex": (None, ""),
    "ebnf": (None, ""),
    "structural_tag": (None, ""),
}


class GenerateBody(BaseModel):
    """`/generate` body: SGLang's `GenerateReqInput`, the fields the built-in engine serves. Other known
    SGLang fields are refused by name when set (see `_UNSUPPORTED_GENERATE_FIELDS`); unknown ones ignored."""

    model_config = ConfigDict(extra="allow")

    rid: str | list[str] | None = None
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False


_UNSUPPORTED_GENERATE_FIELDS = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "token_ids_logprob",
    "custom_logit_processor",
    "return_hidden_states",
    "session_params",
)


# -- normalised requests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSampling:
    """One sample's sampling parameters after SGLang's normalisation (greedy folded in, top_k 0 = off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: whole vocabulary
    min_p: float = 0.0
    max_new_tokens: int = SGLANG_DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """top_k 1 is argmax; SGLang turns temperature 0 into temperature 1 with top_k 1 as well."""
        return self.top_k == 1

    @property
    def logprob_temperature(self) -> float:
        """Log-probs are log_softmax(logits / T), before top-k/top-p/min-p filtering, as SGLang's
        sampler computes them; greedy requests report T = 1."""
        return self.temperature

    def batch_key(self) -> tuple[Any, ...]:
        """Samples with equal keys can share one batched forward: everything but what is applied per row
        (max_new_tokens, stop strings, detokenisation options) and the seed (the batch's seed is derived
        from its rows' seeds)."""
        return (
            self.temperature,
            self.top_p,
            self.top_k,
            self.min_p,
            self.min_new_tokens,
            self.stop_token_ids,
            self.ignore_eos,
        )


@dataclass
class GenerationRequest:
    """One sample to generate: one prompt, one set of sampling parameters (n > 1 is already expanded)."""

    rid: str
    input_ids: list[int]
    sampling: RequestSampling
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt log-probs; k >= 0: from prompt position k
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    logical_rid: str | None = None  # the rid the caller gave when n > 1 expanded it (abort by either)


@dataclass
class NormalizedGenerate:
    """A `/generate` body as per-sample requests, prompt-major when n > 1 (SGLang's output order)."""

    is_single: bool  # the response is one object, not a list
    requests: list[GenerationRequest]


@dataclass
class GenerationOutput:
    """What the engine produced for one request; `generate_response` turns it into SGLang's JSON."""

    rid: str
    prompt_tokens: int
    output_ids: list[int]
    output_logprobs: list[float]  # log p(token) at logprob_temperature, one per output id
    finish: Finish
    text: str | None = None  # None with --skip-tokenizer-init
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    input_logprobs: list[float | None] | None = None  # from logprob_start_len; entry 0 is None (SGLang)
    input_ids_for_logprobs: list[int] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    e2e_latency: float = 0.0
    weight_version: str = "default"  # the engine's weight_version when it generated this


def parse_sampling_params(raw: Mapping[str, Any] | None) -> tuple[RequestSampling, int]:
    """SGLang `sampling_params` dict -> (normalised sampling, n). Raises ProtocolError like SGLang's
    `SamplingParams.verify` (or for a feature the built-in engine lacks, naming it)."""
    try:
        body = SamplingParamsBody.model_validate(dict(raw or {}))
    except ValidationError as exc:
        raise ProtocolError(f"invalid sampling_params: {_pydantic_message(exc)}") from None
    for name, neutral in _NEUTRAL_SAMPLING.items():
        if getattr(body, name) not in neutral:
            raise ProtocolError(f"sampling_params.{name} is not supported by the built-in engine")
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    top_p = 1.0 if body.top_p is None else float(body.top_p)
    top_k = -1 if body.top_k is None else int(body.top_k)
    min_p = 0.0 if body.min_p is None else float(body.min_p)
    max_new = SGLANG_DEFAULT_MAX_NEW_TOKENS if body.max_new_tokens is None else int(body.max_new_tokens)
    min_new = 0 if body.min_new_tokens is None else int(body.min_new_tokens)
    n = 1 if body.n is None else int(body.n)
    if not math.isfinite(temperature) or temperature < 0:
        raise ProtocolError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ProtocolError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise ProtocolError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 and top_k != -1:
        raise ProtocolError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if max_new < 0:
        raise ProtocolError(f"max_new_tokens must be at least 0, got {max_new}.")
    if not 0 <= min_new <= max_new:
        raise ProtocolError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")
    if n < 1:
        raise ProtocolError(f"n must be at least 1, got {n}.")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise ProtocolError("stop strings must be non-empty")
    greedy = 0 <= temperature < _GREEDY_EPS
    sampling = RequestSampling(
        temperature=1.0 if greedy else temperature,
        top_p=top_p,
        top_k=1 if greedy else (0 if top_k == -1 or top_k >= _TOP_K_ALL else top_k),
        min_p=min_p,
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        stop_token_ids=tuple(sorted({int(t) for t in body.stop_token_ids or ()})),
        ignore_eos=bool(body.ignore_eos),
        stop=stop,
        skip_special_tokens=True if body.skip_special_tokens is None else bool(body.skip_special_tokens),
        no_stop_trim=bool(body.no_stop_trim),
        seed=body.sampling_seed,
    )
    return sampling, n


def normalize_generate(
    raw: Mapping[str, Any], encode: Callable[[str], list[int]] | None, *, vocab_size: int | None = None
) -> NormalizedGenerate:
    """`/generate` JSON -> per-sample requests, following `GenerateReqInput.normalize_batch_and_arguments`:
    a single prompt stays single unless n > 1; rids default to fresh uuids (a string rid of a batch
    becomes `<rid>_<i>`); n > 1 expands prompt-major with child rids `<rid>_<uuid>`. `encode` tokenizes
    `text` (None: the server runs with --skip-tokenizer-init and takes input_ids only)."""
    try:
        body = GenerateBody.model_validate(dict(raw))
    except ValidationError as exc:
        raise ProtocolError(f"invalid generate request: {_pydantic_message(exc)}") from None
    extra = body.model_extra or {}
    for name in _UNSUPPORTED_GENERATE_FIELDS:
        if extra.get(name) not in (None, False, [], {}):
            raise ProtocolError(f"{name} is not supported by the built-in engine")
    if body.stream:
        raise ProtocolError("stream=true is not supported by the built-in engine; send stream=false")
    if (body.text is None) == (body.input_ids is None):
        raise ProtocolError("Either text or input_ids should be provided (exactly one of them).")

    if body.text is not None:
        if encode is None:
            raise ProtocolError("text input needs a tokenizer; this server runs with --skip-tokenizer-init")
        is_single = isinstance(body.text, str)
        texts = [body.text] if isinstance(body.text, str) else list(body.text)
        prompts = [encode(t) for t in texts]
    else:
        ids = body.input_ids or []
        if not ids:
            raise ProtocolError("input_ids cannot be empty.")
        is_single = isinstance(ids[0], int)
        prompts = [list(ids)] if is_single else [list(p) for p in ids]  # type: ignore[arg-type]
    if not prompts:
        raise ProtocolError("the batch is empty")
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ProtocolError(f"prompt {index} has no tokens")
        if vocab_size is not None and any(not 0 <= t < vocab_size for t in prompt):
            raise ProtocolError(f"prompt {index} has token ids outside [0, {vocab_size})")
    batch_size = len(prompts)

    raw_sampling = body.sampling_params
    if isinstance(raw_sampling, list):
        if len(raw_sampling) != batch_size:
            raise ProtocolError("The length of sampling_params should be equal to the batch size.")
        parsed = [parse_sampling_params(p) for p in raw_sampling]
    else:
        parsed = [parse_sampling_params(raw_sampling)] * batch_size
    n = parsed[0][1]
    if any(item_n != n for _, item_n in parsed):
        raise ProtocolError("The parallel_sample_num should be the same for all samples in sample params.")
    if n > 1:
        is_single = False

    if body.rid is None:
        rids = [uuid.uuid4().hex for _ in range(batch_size)]
    elif isinstance(body.rid, str):
        rids = [body.rid] if batch_size == 1 else [f"{body.rid}_{i}" for i in range(batch_size)]
    else:
        if len(body.rid) != batch_size:
            raise ProtocolError(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        rids = list(body.rid)
    if len(set(rids)) != len(rids):
        raise ProtocolError(f"Duplicate request IDs detected within the request: {rids}")

    def per_item(value: Any, default: Any, name: str) -> list[Any]:
        if value is None:
            return [default] * batch_size
        if isinstance(value, list):
            if n > 1:
                raise ProtocolError(f"Cannot use list {name} with parallel_sample_num > 1")
            if len(value) != batch_size:
                raise ProtocolError(f"The length of {name} should be equal to the batch size.")
            return list(value)
        return [value] * batch_size

    return_logprob = per_item(body.return_logprob, False, "return_logprob")
    start_len = per_item(body.logprob_start_len, -1, "logprob_start_len")
    top_num = per_item(body.top_logprobs_num, 0, "top_logprobs_num")
    requests = []
    for i in range(batch_size):
        if top_num[i] < 0:
            raise ProtocolError(f"top_logprobs_num must be >= 0, got {top_num[i]}")
        for _ in range(n):
            requests.append(
                GenerationRequest(
                    rid=rids[i] if n == 1 else f"{rids[i]}_{uuid.uuid4().hex}",
                    input_ids=prompts[i],
                    sampling=parsed[i][0],
                    return_logprob=bool(return_logprob[i]),
                    logprob_start_len=int(start_len[i]),
                    top_logprobs_num=int(top_num[i]),
                    return_text_in_logprobs=body.return_text_in_logprobs,
                    logical_rid=rids[i],
                )
            )
    return NormalizedGenerate(is_single=is_single, requests=requests)


def batch_seed(seeds: Sequence[int | None]) -> int | None:
    """The torch seed for one batch of rows: none when no row has a seed, the seed itself when all rows
    share one (then the batch reproduces the in-process engine called with that seed), else a stable hash
    of the row seeds (reproducible for the same request, though not row by row)."""
    if all(s is None for s in seeds):
        return None
    if len(set(seeds)) == 1:
        return int(seeds[0])  # type: ignore[arg-type]
    digest = hashlib.sha256(repr(list(seeds)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# -- responses ------------------------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    """JSON has no -inf/NaN; SGLang's orjson writes them as null, and so do we."""
    return value if value is not None and math.isfinite(value) else None


def generate_response(
    out: GenerationOutput, request: GenerationRequest, *, token_text: Callable[[int], str] | None = None
) -> dict[str, Any]:
    """One `/generate` output object: `text`, `output_ids`, `meta_info` with SGLang's keys. Log-prob
    entries are `[logprob, token_id, text-or-null]` (text only with return_text_in_logprobs)."""

    def entry(logprob: float | None, token_id: int) -> list[Any]:
        text = token_text(token_id) if request.return_text_in_logprobs and token_text else None
        return [_finite(logprob), token_id, text]

    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish.to_json(),
        "prompt_tokens": out.prompt_tokens,
        "weight_version": out.weight_version,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": 0,
        "e2e_latency": out.e2e_latency,
    }
    if request.return_logprob:
        inputs = out.input_logprobs or []
        input_ids = out.input_ids_for_logprobs or []
        meta["input_token_logprobs"] = [entry(lp, t) for lp, t in zip(inputs, input_ids, strict=True)]
        meta["output_token_logprobs"] = [
            entry(lp, t) for lp, t in zip(out.output_logprobs, out.output_ids, strict=True)
        ]
        meta["output_token_logprobs_length"] = len(out.output_ids)
        if request.top_logprobs_num > 0:
            meta["input_top_logprobs"] = [
                None if row is None else [entry(lp, t) for lp, t in row]
                for row in out.input_top_logprobs or []
            ]
            meta["output_top_logprobs"] = [
                [entry(lp, t) for lp, t in row] for row in out.output_top_logprobs or []
            ]
    response: dict[str, Any] = {}
    if out.text is not None:
        response["text"] = out.text
    response["output_ids"] = list(out.output_ids)
    response["meta_info"] = meta
    return response


# -- the client side: our types <-> SGLang's JSON ---------------------------------------------------------------


def to_sglang_sampling_params(
    params: SamplingParams, *, seed: int | None = None, skip_special_tokens: bool = True
) -> dict[str, Any]:
    """The built-in engine's `SamplingParams` as SGLang `sampling_params`. Temperature 0 stays 0 (SGLang's
    greedy); top_k -1 and top_p 1.0 mean off on both sides; stop strings end the response with their
    tokens kept in `output_ids` on both sides. `seed` becomes `sampling_seed`."""
    out: dict[str, Any] = {
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k > 0 else -1,
        "max_new_tokens": int(params.max_new_tokens),
        "skip_special_tokens": skip_special_tokens,
    }
    if params.stop_token_ids:
        out["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
    if params.stop:
        out["stop"] = list(params.stop)
    if params.min_new_tokens:
        out["min_new_tokens"] = int(params.min_new_tokens)
    if seed is not None:
        out["sampling_seed"] = int(seed)
    return out


@dataclass
class SGLangGeneration:
    """One `/generate` output as the runtime uses it: the `Sample` fields (response tokens, text,
    per-token log-probs, status from the finish reason) plus what SGLang reports about it."""

    rid: str
    token_ids: list[int]
    text: str | None
    log_probs: list[float]  # empty unless the request asked for return_logprob
    finish: Finish
    prompt_tokens: int
    weight_version: str | None
    meta_info: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> SampleStatus:
        return self.finish.sample_status

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SGLangGeneration:
        meta = dict(data.get("meta_info") or {})
        output_ids = [int(t) for t in data.get("output_ids") or []]
        entries = meta.get("output_token_logprobs")
        log_probs: list[float] = []
        if entries is not None:
            # SGLang takes the response tokens from these entries too (slime does the same): they are
            # the authoritative token list when both are present.
            tokens = [int(e[1]) for e in entries]
            if output_ids and tokens != output_ids:
                raise ProtocolError("output_token_logprobs and output_ids disagree on the response tokens")
            output_ids = tokens
            log_probs = [float("-inf") if e[0] is None else float(e[0]) for e in entries]
        return cls(
            rid=str(meta.get("id", "")),
            token_ids=output_ids,
            text=data.get("text"),
            log_probs=log_probs,
            finish=Finish.from_json(meta.get("finish_reason")),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            weight_version=None if meta.get("weight_version") is None else str(meta["weight_version"]),
            meta_info=meta,
        )

    def to_generation_result(self, default_weight_version: int = 0) -> GenerationResult:
        """As the built-in engine returns it, stamped with the server's `weight_version` when that is an
        integer (ours and the runtime's adapters send `str(int)`), else `default_weight_version`. An
        aborted output has no `FinishReason`: it raises, naming the request, rather than entering
        training as a truncated sample."""
        if self.finish.type is FinishType.ABORT:
            raise ProtocolError(f"request {self.rid} was aborted by the engine: {self.finish.message}")
        if len(self.log_probs) != len(self.token_ids):
            raise ProtocolError(
                f"request {self.rid}: {len(self.log_probs)} log-probs for {len(self.token_ids)} tokens"
            )
        reason = FinishReason.STOP if self.finish.type is FinishType.STOP else FinishReason.LENGTH
        version = self.weight_version
        stamped = (
            int(version) if version is not None and version.lstrip("-").isdigit() else default_weight_version
        )
        return GenerationResult(list(self.token_ids), list(self.log_probs), reason, stamped)


def parse_generate_outputs(data: Any) -> list[SGLangGeneration]:
    """A `/generate` response (one object, or a list for a batch) -> outputs in request order."""
    items = data if isinstance(data, list) else [data]
    return [SGLangGeneration.from_json(item) for item in items]


def _pydantic_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
        for err in exc.errors(include_url=False)
    )
