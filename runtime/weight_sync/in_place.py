"""Colocated weight hand-over: the trainer's tensors copied straight into a rollout engine in the same process.

When the trainer and the engine share one GPU and one process (`bench/gpu_grpo.py`; a colocated rank that
runs both), there is nothing to serialize: the trainer yields its weights under Hugging Face names as tensors
on the device (`MegatronTrainBackend.iter_device_weights`, which reads the live parameters and only fuses
or splits what the two layouts lay out differently), and the engine copies them into its own preallocated
buffers (`FastGenEngine.load_weights`: no reallocation, so its captured CUDA graphs stay valid). No host
round trip, no HTTP, no object store.

What it guarantees:
- **version**: the push names the version it brings; the engine takes only the one after its own
  (`weight_version + 1`) and refuses any other, naming both. A caller with versions of its own (the driver's
  policy versions, which repeat at the first push and skip under `update-weights-interval`) names the
  version it last gave the engine (`expected`): the engine must hold exactly that.
- **completeness**: every tensor the engine holds must come. Unbucketed (the default), the whole set is
  checked (names, shapes) before anything is copied, so a refused push leaves the engine as it was.
  Bucketed (`bucket_bytes`, for models whose second copy would not fit), each bucket is checked before it
  is copied and a missing tensor is refused at the end, with the engine's version unchanged; its weights are
  then a mix and it must not serve until a complete push succeeds.
- **no host trip**: a tensor on another device than the engine's is refused, never moved silently.

`WeightReceiver` / `WeightSync` in `base.py` are the Ray-actor side (the engines in other processes); this
module is for the case where both live in one process.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch


class InPlaceEngine(Protocol):
    """What a colocated engine offers (`runtime.rollout.fastgen.FastGenEngine` does)."""

    torch_device: torch.device
    weight_version: int

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None: ...

    def start_weight_update(self, version: int) -> None: ...

    def load_weight_bucket(self, named_tensors: Mapping[str, torch.Tensor]) -> None: ...

    def finish_weight_update(self) -> None: ...


@dataclass(frozen=True)
class InPlaceUpdate:
    """What one push did: the version the engine now holds, tensors and bytes copied, buckets, seconds."""

    version: int
    tensors: int
    bytes: int
    buckets: int
    seconds: float


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    index = torch.cuda.current_device
    return (a.index if a.index is not None else index()) == (b.index if b.index is not None else index())


class InPlaceWeightSync:
    """Pushes a trainer's weights into one engine of the same process, in place, version by version."""

    def __init__(self, engine: InPlaceEngine, *, bucket_bytes: int | None = None) -> None:
        self.engine = engine
        self.bucket_bytes = bucket_bytes

    def _checked(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not _same_device(tensor.device, self.engine.torch_device):
            raise ValueError(
                f"in-place weight update: {name!r} is on {tensor.device}, the engine on "
                f"{self.engine.torch_device} (colocated hand-over never moves weights between devices)"
            )
        return tensor.detach()

    def push(
        self, weights: Iterable[tuple[str, torch.Tensor]], *, version: int, expected: int | None = None
    ) -> InPlaceUpdate:
        """Copy `weights` ((Hugging Face name, tensor) pairs on the engine's device) into the engine as
        `version`; raises (see the module docstring) on a wrong version, an unknown, missing or misshapen
        tensor, or a tensor on another device.

        `expected`: the version the caller last gave this engine (the driver's policy versions, which may
        repeat or skip: `update-weights-interval`, a resume); the engine must hold exactly that, and
        `version` may not go back. None: `version` must be the engine's next (`weight_version + 1`)."""
        started = time.perf_counter()
        engine = self.engine
        current = engine.weight_version
        if expected is not None:  # before reading any weight
            if current != expected:
                raise ValueError(
                    f"in-place weight update to version {version}: the engine holds {current}, "
                    f"the driver expected it to hold {expected}"
                )
            if version < expected:
                raise ValueError(
                    f"in-place weight update to version {version}: older than the engine's {current}"
                )
        elif version != current + 1:
            raise ValueError(
                f"in-place weight update to version {version}: the engine holds {current}, "
                f"expected {current + 1}"
            )
        step = current + 1  # what the engine's own check takes; `version` is recorded once the push is whole
        count = size = buckets = 0
        if self.bucket_bytes is None:
            named: dict[str, torch.Tensor] = {}
            for name, tensor in weights:
                named[name] = self._checked(name, tensor)
            engine.load_weights(named, step)  # checks everything before copying anything
            count, buckets = len(named), 1
            size = sum(t.numel() * t.element_size() for t in named.values())
        else:
            engine.start_weight_update(step)
            bucket: dict[str, torch.Tensor] = {}
            held = 0
            for name, tensor in weights:
                bucket[name] = self._checked(name, tensor)
                held += tensor.numel() * tensor.element_size()
                if held >= self.bucket_bytes:
                    engine.load_weight_bucket(bucket)
                    count, size, buckets = count + len(bucket), size + held, buckets + 1
                    bucket, held = {}, 0
            if bucket:
                engine.load_weight_bucket(bucket)
                count, size, buckets = count + len(bucket), size + held, buckets + 1
            engine.finish_weight_update()  # refuses a missing tensor; only then takes the version
        if engine.weight_version != step:
            raise RuntimeError(
                f"in-place weight update: the engine reports {engine.weight_version}, not {step}"
            )
        engine.weight_version = version
        return InPlaceUpdate(version, count, size, buckets, time.perf_counter() - started)
