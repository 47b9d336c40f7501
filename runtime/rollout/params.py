"""What a rollout request asks for and what it gets back, shared by every engine (built-in, fastgen, an
SGLang server) and their callers. No torch or transformers here: the processes that only drive an engine
(the HTTP engine actor, the driver's rollout code) import this without loading a model stack."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token or stop string was generated (it ends the response)
    LENGTH = "length"  # the request's token budget was reached first
    ABORT = "abort"  # aborted in flight (partial rollout): the tokens so far, resumable later (fastgen only)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling; mirrors the `rollout-*` spec fields. top_k -1 and top_p 1.0 disable them;
    temperature 0 is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()  # added to the model's own EOS ids
    stop: tuple[str, ...] = ()  # `rollout-stop`: the response ends after the first of these strings (kept)
    min_new_tokens: int = 0  # `eval-min-new-tokens`: stop tokens are suppressed before this many tokens
    seed: int | None = None  # seeds the sampler for this call (reproducible rollouts)


@dataclass
class GenerationResult:
    token_ids: list[int]  # response ids, the stop token (or the tokens of a stop string) included
    log_probs: list[float]  # log p(token) under softmax(logits / temperature), one per token
    finish_reason: FinishReason
    weight_version: int = 0  # the engine's weights when it generated this
