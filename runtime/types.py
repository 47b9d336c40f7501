"""Typed hand-offs between pipeline stages: `Sample` (one prompt/response) and `RolloutBatch` (padded tensors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

Prompt = str | list[dict[str, Any]]  # plain text, or OpenAI-style messages when apply-chat-template is set


class SampleStatus(StrEnum):
    PENDING = "pending"  # created from a prompt, not generated yet
    COMPLETED = (
        "completed"  # generation stopped on a stop token (EOS); the stop token is part of the response
    )
    TRUNCATED = "truncated"  # generation hit rollout-max-response-len before a stop token
    ABORTED = "aborted"  # interrupted mid-generation (partial rollout): back to the buffer, resumed later


@dataclass
class Sample:
    """One response to one prompt, as it travels data -> rollout -> reward -> train.

    `tokens` holds prompt then response token ids; the last `response_length` of them are the response.
    `rollout_log_probs[i]` is the engine's log-probability (at the sampling temperature) of response token i.
    `loss_mask`, when set, has one 0/1 entry per response token (multi-turn rollouts mask tool output);
    None means every response token is trained.
    """

    index: int  # position of the sample in its rollout (0..B-1)
    group_index: int  # samples generated from the same prompt share this (GRPO groups)
    prompt: Prompt  # the prompt as read from the dataset (before chat template)
    label: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    response_length: int = 0
    response: str = ""
    rollout_log_probs: list[float] = field(default_factory=list)
    loss_mask: list[int] | None = None
    reward: float | None = None
    status: SampleStatus = SampleStatus.PENDING
    weight_version: int = 0  # version of the weights the engine generated with (the latest, if several)
    # One entry per generation pass that added tokens: partial rollout resumes an aborted sample with newer
    # weights, so a response can span versions. Staleness is measured from the oldest.
    weight_versions: list[int] = field(default_factory=list)
    abort_count: int = (
        0  # times partial rollout interrupted this sample (`partial-rollout-max-aborted-count`)
    )

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def oldest_weight_version(self) -> int:
        return min(self.weight_versions) if self.weight_versions else self.weight_version

    @property
    def is_finished(self) -> bool:
        return self.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)

    def to_record(self) -> dict[str, Any]:
        """JSON-ready view written to `rollout_result/<split>/<rollout_id>.jsonl`."""
        return {
            "index": self.index,
            "group_index": self.group_index,
            "prompt": self.prompt,
            "response": self.response,
            "label": self.label,
            "reward": self.reward,
            "status": str(self.status),
            "response_length": self.response_length,
            "prompt_length": self.prompt_length,
            "weight_version": self.weight_version,
            "weight_versions": self.weight_versions,
            "abort_count": self.abort_count,
            "metadata": self.metadata,
        }

    def to_state(self) -> dict[str, Any]:
        """Everything, JSON-ready: the buffer in checkpoints and debug rollout data round-trip through it."""
        state = dataclasses.asdict(self)
        state["status"] = str(self.status)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Sample:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in state.items() if k in known}
        values["status"] = SampleStatus(values.get("status", SampleStatus.PENDING))
        return cls(**values)


@dataclass
class RolloutBatch:
    """A rollout as right-padded tensors; B samples, T = longest prompt + response.

    Every per-token tensor is aligned with `tokens`: entry [b, t] concerns token t of sample b, and a
    log-prob at [b, t] is log p(tokens[b, t] | tokens[b, :t]) (column 0 is always 0).

    tokens            long  [B, T]  prompt + response ids, pad_token_id after the end
    attention_mask    long  [B, T]  1 on real tokens
    loss_mask         float [B, T]  1 on response tokens that are trained, 0 on prompt and padding
    group_index       long  [B]     prompt id; samples of one prompt share it
    rewards           float [B]     raw scalar reward per sample (0 for SFT)
    rollout_log_probs float [B, T]  engine log-probs of response tokens (0 elsewhere)
    old_log_probs     float [B, T]  trainer log-probs before the update (filled by the trainer), or None
    ref_log_probs     float [B, T]  reference-model log-probs (only when a KL term needs them), or None
    advantages        float [B, T]  per-token advantages (filled by the advantages stage), or None
    returns           float [B, T]  per-token returns (critic targets), or None
    values            float [B, T]  critic values at rollout time (ppo): column t is V(tokens[:t]), the
                                    value of the prefix before token t, shifted like the log-probs; or None
    teacher_log_probs float [B, T]  an on-policy-distillation teacher's log-probs of the tokens, or None
    response_mask     float [B, T]  1 on every response token, trained or not (multi-turn tool output):
                                    GAE's time steps; None = loss_mask
    """

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    group_index: torch.Tensor
    rewards: torch.Tensor
    rollout_log_probs: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None
    teacher_log_probs: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None

    @classmethod
    def from_samples(cls, samples: list[Sample], pad_token_id: int) -> RolloutBatch:
        if not samples:
            raise ValueError("cannot build a RolloutBatch from zero samples")
        batch_size = len(samples)
        width = max(len(s.tokens) for s in samples)
        tokens = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        loss_mask = torch.zeros((batch_size, width), dtype=torch.float32)
        rollout_log_probs = torch.zeros((batch_size, width), dtype=torch.float32)
        response_mask = torch.zeros((batch_size, width), dtype=torch.float32)
        for row, sample in enumerate(samples):
            n, start = len(sample.tokens), sample.prompt_length
            tokens[row, :n] = torch.tensor(sample.tokens, dtype=torch.long)
            attention_mask[row, :n] = 1
            response_mask[row, start:n] = 1.0
            mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
            if len(mask) != sample.response_length:
                raise ValueError(
                    f"sample {sample.index}: loss_mask has {len(mask)} entries, response has "
                    f"{sample.response_length} tokens"
                )
            loss_mask[row, start:n] = torch.tensor(mask, dtype=torch.float32)
            if sample.rollout_log_probs:
                rollout_log_probs[row, start:n] = torch.tensor(sample.rollout_log_probs, dtype=torch.float32)
        return cls(
            tokens=tokens,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            group_index=torch.tensor([s.group_index for s in samples], dtype=torch.long),
            rewards=torch.tensor([float(s.reward or 0.0) for s in samples], dtype=torch.float32),
            rollout_log_probs=rollout_log_probs,
            # only needed where some response tokens are not trained (tool output, off-policy masking)
            response_mask=response_mask if any(s.loss_mask is not None for s in samples) else None,
        )

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.attention_mask.sum())

    def select(self, rows: slice | torch.Tensor) -> RolloutBatch:
        """The sub-batch of the given rows, trimmed to its own longest sequence."""
        picked = {
            f.name: (value[rows] if isinstance(value := getattr(self, f.name), torch.Tensor) else value)
            for f in dataclasses.fields(self)
        }
        width = max(int(picked["attention_mask"].sum(dim=1).max()), 1)
        for name, value in picked.items():
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                picked[name] = value[:, :width]
        return RolloutBatch(**picked)

    def micro_batches(self, micro_batch_size: int) -> list[RolloutBatch]:
        return [
            self.select(slice(i, i + micro_batch_size)) for i in range(0, self.batch_size, micro_batch_size)
        ]

    def token_budget_batches(self, max_tokens: int) -> list[RolloutBatch]:
        """Consecutive micro-batches of at most `max_tokens` real tokens each (`use-dynamic-batch-size`);
        a sample longer than the budget gets a micro-batch of its own."""
        lengths = self.attention_mask.sum(dim=1).tolist()
        parts, start, used = [], 0, 0
        for row, length in enumerate(lengths):
            if row > start and used + length > max_tokens:
                parts.append(self.select(slice(start, row)))
                start, used = row, 0
            used += length
        parts.append(self.select(slice(start, len(lengths))))
        return parts


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` items in `parts` shares as equal as they can be, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
