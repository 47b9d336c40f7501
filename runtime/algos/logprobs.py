"""Per-token log-probs and entropies from next-token logits, aligned with the token columns."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: [..., V] -> [...]."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens[:, t] | tokens[:, :t]) from next-token logits: logits [B, T, V], tokens [B, T] -> [B, T].

    logits[:, t] predicts token t + 1, so column 0 (no prediction) is 0. The logits are divided by the
    sampling temperature first, so the result matches what the rollout engine reports.
    """
    log_p = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = log_p.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the distribution each token was drawn from: logits [B, T, V] -> [B, T], column 0 is 0.

    Keeps the graph of `logits`: pass detached logits when the entropy is only a metric, live ones when
    `entropy-coef` is non-zero (the entropy bonus needs its gradient).
    """
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1].float() / temperature), (1, 0))
