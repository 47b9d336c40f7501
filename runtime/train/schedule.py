"""Learning-rate schedules (Megatron's `lr-decay-style`): warmup, then constant, linear or cosine decay."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class DecayStyle(StrEnum):
    CONSTANT = "constant"  # lr after warmup
    LINEAR = "linear"  # lr -> min_lr linearly over the decay steps (Megatron's default)
    COSINE = "cosine"  # lr -> min_lr along half a cosine


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    min_lr: float = 0.0
    style: DecayStyle = DecayStyle.CONSTANT
    warmup_steps: int = 0
    decay_steps: int | None = None  # optimizer steps over which to decay; None = no decay (constant)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based).

        >>> s = LRSchedule(lr=1.0, min_lr=0.0, style=DecayStyle.LINEAR, warmup_steps=2, decay_steps=6)
        >>> [round(s.lr_at(i), 2) for i in range(7)]
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
        """
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.style is DecayStyle.CONSTANT or not self.decay_steps:
            return self.lr
        span = max(1, self.decay_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.style is DecayStyle.LINEAR:
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.lr - self.min_lr) * factor
