"""The contract every training backend fulfils, and the `train-backend` registry."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import torch

from runtime.registry import Registry
from runtime.train.checkpoint import CheckpointRecord
from runtime.types import RolloutBatch


class TrainBackendName(StrEnum):
    TORCH = "torch"  # Hugging Face model + AdamW on CPU or one GPU (small models, CI, CPU pools)
    MEGATRON = "megatron"  # megatron-core, one Ray actor per rank (docs/adr/0006)


#: Backends that run one trainer actor per rank (SPMD: every call goes to every rank, rank 0 answers).
MULTI_RANK_BACKENDS = frozenset({TrainBackendName.MEGATRON})


def is_multi_rank(name: str) -> bool:
    return name in MULTI_RANK_BACKENDS


@dataclass(frozen=True)
class TrainContext:
    """Where one trainer actor stands in its job's trainer group, and the job's parameters.

    rank / world_size: this actor among the trainer's ranks (the torch backend: 0 of 1).
    master_addr / master_port: the rendezvous rank 0 picked (loopback by default); handed over as
    constructor arguments, never through an environment variable another job could read.
    values: the normalized spec's values by their dests (`RuntimeSpec.values()`): a backend reads its
    own parameters there (Megatron's arguments), not from a hand-made copy.
    """

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)


class TrainBackend(Protocol):
    """What the train actor calls. Batches arrive whole; the backend splits them into optimizer steps
    (`global-batch-size`) and micro-batches (`micro-batch-size`) itself.

    Constructed as `cls(hf_checkpoint, config, *, device, need_ref, context: TrainContext)`. A multi-rank
    backend gets every call on every rank with the same arguments (each rank takes its data-parallel
    share of a batch); only rank 0's answer reaches the driver, so the other ranks may return empty
    values (`named_weights`, records)."""

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
_BUILTIN_MODULES = {
    TrainBackendName.TORCH: "runtime.train.torch_backend",
    TrainBackendName.MEGATRON: "runtime.train.megatron.backend",
}


def train_backend_class(name: str) -> type:
    module = _BUILTIN_MODULES.get(name)  # type: ignore[call-overload]
    if module is not None:
        importlib.import_module(module)
    return TRAIN_BACKENDS.get(name)
