"""The role actor classes (Ray wraps them with `ray.remote`): the trainer and the rollout engine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from runtime.devices import Device
from runtime.rollout.engine import GenerationResult, SamplingParams, TorchRolloutEngine
from runtime.train.base import TrainBackend, train_backend_class
from runtime.train.checkpoint import CheckpointRecord
from runtime.train.torch_backend import TrainConfig
from runtime.types import RolloutBatch


def _setup_process(num_threads: int) -> None:
    # Each actor gets a slice of the machine: more intra-op threads than its CPU share only oversubscribes.
    torch.set_num_threads(max(1, num_threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TrainActor:
    """The `actor` role: owns a training backend (policy, optimizer, reference model)."""

    def __init__(
        self, backend: str, hf_checkpoint: str, config: TrainConfig, *, need_ref: bool, num_threads: int = 1
    ) -> None:
        _setup_process(num_threads)
        backend_cls = train_backend_class(backend)
        self.backend: TrainBackend = backend_cls(
            hf_checkpoint, config, device=Device.detect(), need_ref=need_ref
        )

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": str(Device.detect().kind), "threads": torch.get_num_threads()}

    def compute_log_probs(self, batch: RolloutBatch) -> RolloutBatch:
        return self.backend.compute_log_probs(batch)

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return self.backend.train_step(batch)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return self.backend.named_weights()

    def parameter_checksum(self) -> float:
        return self.backend.parameter_checksum()

    def offload(self) -> None:
        self.backend.offload()

    def onload(self) -> None:
        self.backend.onload()

    def save_checkpoint(self, save_dir: str, iteration: int, extra_state: dict[str, Any]) -> CheckpointRecord:
        return self.backend.save_checkpoint(save_dir, iteration, extra_state)

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        return self.backend.load_checkpoint(load_dir)

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord:
        return self.backend.export_hf(out_dir, step)


class RolloutEngineActor:
    """The `rollout` role: one built-in torch engine holding its own copy of the policy."""

    def __init__(
        self, hf_checkpoint: str, *, engine_index: int, num_threads: int = 1, max_batch_size: int = 256
    ) -> None:
        _setup_process(num_threads)
        self.engine_index = engine_index
        self.engine = TorchRolloutEngine(hf_checkpoint, device=Device.detect(), max_batch_size=max_batch_size)

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "engine_index": self.engine_index, "threads": torch.get_num_threads()}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        return self.engine.generate(prompts, params)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> int:
        self.engine.load_weights(named_tensors, version)
        return version

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()
