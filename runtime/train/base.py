"""The contract every training backend fulfils, and the `train-backend` registry."""

from __future__ import annotations

import importlib
from enum import StrEnum
from typing import Any, Protocol

import torch

from runtime.registry import Registry
from runtime.train.checkpoint import CheckpointRecord
from runtime.types import RolloutBatch


class TrainBackendName(StrEnum):
    TORCH = "torch"  # Hugging Face model + AdamW on CPU or one GPU (small models, CI, CPU pools)


class TrainBackend(Protocol):
    """What the train actor calls. Batches arrive whole; the backend splits them into optimizer steps
    (`global-batch-size`) and micro-batches (`micro-batch-size`) itself."""

    def compute_log_probs(
        self, batch: RolloutBatch, *, old: bool = True, ref: bool = True
    ) -> RolloutBatch: ...

    def train_step(self, batch: RolloutBatch) -> dict[str, float]: ...

    def named_weights(self) -> dict[str, torch.Tensor]: ...

    def parameter_checksum(self) -> float: ...

    def offload(self) -> None: ...

    def onload(self) -> None: ...

    def save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], *, blocking: bool = True
    ) -> CheckpointRecord | None: ...

    def finished_saves(self, *, wait: bool = False) -> list[CheckpointRecord]: ...

    def evaluate_nll(self, batch: RolloutBatch) -> tuple[float, int]: ...

    def update_reference(self) -> None: ...

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None: ...

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord: ...


TRAIN_BACKENDS: Registry[type] = Registry("train-backend")

# Built-in backends register themselves when their module is imported; importing lazily keeps heavy
# dependencies (megatron-core) out of processes that do not use them.
_BUILTIN_MODULES = {TrainBackendName.TORCH: "runtime.train.torch_backend"}


def train_backend_class(name: str) -> type:
    module = _BUILTIN_MODULES.get(name)  # type: ignore[call-overload]
    if module is not None:
        importlib.import_module(module)
    return TRAIN_BACKENDS.get(name)
