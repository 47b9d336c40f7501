"""A colocated trainer rank that also hosts its rollout engine, in the same process (`EngineKind.IN_TRAINER`).

The driver sees the one actor twice: as a trainer rank (`TrainGroup`) and as a rollout engine
(`RolloutGroup`, whose `generate` is the engine's), so the rollout goes through the same generation and
reward code as with engines of their own. What differs is the weight hand-over and the turns:

- weights: after a training step every rank copies its weights into its own engine in place
  (`runtime.weight_sync.in_place.InPlaceWeightSync` from the backend's `iter_device_weights`: device to
  device, no object store), told the version the driver last gave the engine, which must match;
- turns (`--offload-train` / `--offload-rollout`): the idle side's memory is released (the trainer's
  weights and optimizer state to host, the engine's weights to host and its KV cache dropped) and resumed
  for its turn; on CPU the calls run and free nothing. A push needs both sides resident: it onloads the
  engine, copies, then hands the device to the rollout (the trainer offloads).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from runtime.devices import Device, DeviceKind
from runtime.roles.actors import TrainActor
from runtime.roles.logs import log_exceptions
from runtime.rollout.params import GenerationResult, SamplingParams
from runtime.weight_sync.in_place import InPlaceWeightSync

log = logging.getLogger(__name__)


def colocated_engine(hf_checkpoint: str, *, device: Device, max_batch_size: int = 256) -> Any:
    """The engine a trainer rank hosts: fastgen on CUDA for an architecture it implements
    (`RELAX_ROLLOUT_BACKEND` as for the engine servers: `auto` | `fastgen` | `hf`), else the Hugging Face
    torch engine."""
    from runtime.rollout.backend import RolloutBackend, backend_from_env, resolve_backend

    backend = resolve_backend(backend_from_env(), hf_checkpoint, cuda=device.kind is DeviceKind.CUDA)
    if backend is RolloutBackend.FASTGEN:
        from runtime.rollout.fastgen import FastGenEngine

        return FastGenEngine(hf_checkpoint, device=device, max_batch_size=max_batch_size)
    from runtime.rollout.engine import TorchRolloutEngine

    return TorchRolloutEngine(hf_checkpoint, device=device, max_batch_size=max_batch_size)


# the largest decode batch a hosted engine is given slots for (more requests than that wait for a slot)
MAX_HOSTED_BATCH = 1024


def hosted_batch_size(samples: int, engines: int) -> int:
    """KV slots for each hosted engine: one for every sample of a rollout that lands on it (`samples`
    spread over the `engines`), at most `MAX_HOSTED_BATCH`."""
    return max(1, min(MAX_HOSTED_BATCH, -(-samples // max(1, engines))))


def engine_weights(engine: Any) -> dict[str, torch.Tensor]:
    """The engine's weights by Hugging Face name (views of its own storage)."""
    weights = getattr(engine, "weights", None)
    if weights is not None and hasattr(weights, "target"):  # FastGenEngine's FlatWeights
        return {name: weights.target(name) for name in weights.hf}
    return dict(engine.model.state_dict())


@log_exceptions
class ColocatedActor(TrainActor):
    """A trainer rank (`TrainActor`, all its methods) holding a rollout engine in its own process.

    `offload_train` / `offload_rollout`: whether each side releases its device memory while the other
    works (`--offload-train` / `--offload-rollout`; colocated jobs derive both). `memory_calls()` lists
    the releases and resumes made so far, in order."""

    def __init__(
        self,
        backend: str,
        hf_checkpoint: str,
        config: Any,
        *,
        need_ref: bool,
        engine_index: int = 0,
        offload_train: bool = True,
        offload_rollout: bool = True,
        max_batch_size: int = 256,
        **kwargs: Any,
    ) -> None:
        super().__init__(backend, hf_checkpoint, config, need_ref=need_ref, **kwargs)
        started = time.perf_counter()
        self.engine_index = engine_index
        self.engine = colocated_engine(hf_checkpoint, device=Device.detect(), max_batch_size=max_batch_size)
        self.sync = InPlaceWeightSync(self.engine)
        from runtime.rollout.engine import TorchRolloutEngine

        self._seeds_torch = isinstance(self.engine, TorchRolloutEngine)
        self.offload_train = offload_train
        self.offload_rollout = offload_rollout
        self._calls: list[str] = []
        log.info(
            "rollout engine %d (%s) in trainer rank %d ready in %.1fs (pid %d; offload train=%s rollout=%s)",
            engine_index,
            type(self.engine).__name__,
            self.rank,
            time.perf_counter() - started,
            os.getpid(),
            offload_train,
            offload_rollout,
        )

    def ready(self) -> dict[str, Any]:
        info = super().ready()
        info.update(engine_index=self.engine_index, engine=type(self.engine).__name__)
        return info

    # -- the rollout engine's side (RolloutGroup calls) ---------------------------------------------------
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        if not self._seeds_torch:  # fastgen draws from generators of its own (and may replay CUDA graphs)
            return self.engine.generate(prompts, params, budgets)
        # the HF engine seeds torch's global generators per call: the trainer's random stream stays its
        # own, as when the engine has a process of its own
        cuda = self.engine.torch_device.type == "cuda"
        with torch.random.fork_rng(devices=[self.engine.torch_device] if cuda else []):
            return self.engine.generate(prompts, params, budgets)

    def push_weights_in_place(self, version: int, expected: int) -> dict[str, float]:
        """Copy this rank's weights into its engine as `version`; the engine must hold `expected` (the
        version the driver last gave it) and every tensor must come, else this raises, naming the
        problem. Leaves the device to the rollout."""
        self._place("engine", on_device=True)  # both sides resident for the copy
        self._place("train", on_device=True)
        update = self.sync.push(self.backend.iter_device_weights(), version=version, expected=expected)
        self.use_for_rollout()
        return {"version": update.version, "tensors": update.tensors, "bytes": update.bytes,
                "seconds": update.seconds}  # fmt: skip

    # -- turns ---------------------------------------------------------------------------------------------
    def use_for_rollout(self) -> None:
        if self.offload_train:
            self._place("train", on_device=False)
        self._place("engine", on_device=True)

    def use_for_training(self) -> None:
        if self.offload_rollout:
            self._place("engine", on_device=False)
        self._place("train", on_device=True)

    def memory_calls(self) -> list[str]:
        return list(self._calls)

    def engine_weight_mismatch(self) -> float:
        """The largest |trainer - engine| over the engine's tensors (0.0: the engine holds exactly the
        trainer's weights). A diagnostic: it reads every weight of both, each side onloaded for it if
        released and released again after (not a turn: `memory_calls` does not list it)."""
        engine_off, train_off = self.engine.offloaded, self.backend.offloaded
        if engine_off:
            self.engine.onload()
        if train_off:
            self.backend.onload()
        try:
            own = engine_weights(self.engine)
            worst, seen = 0.0, set()
            for name, tensor in self.backend.iter_device_weights():
                if name in own:
                    seen.add(name)
                    worst = max(worst, float((own[name].float() - tensor.float()).abs().max()))
        finally:
            if train_off:
                self.backend.offload()
            if engine_off:
                self.engine.offload()
        tied = getattr(self.engine, "_is_tied", lambda _name: False)  # the torch engine's tied lm_head
        missing = sorted(name for name in own if name not in seen and not tied(name))
        if missing:
            raise KeyError(f"the trainer yields no {missing[:3]}")
        return worst

    def engine_weight_version(self) -> int:
        return int(self.engine.weight_version)

    def _place(self, side: str, *, on_device: bool) -> None:
        """Onload (`on_device`) or offload the trainer's (`side` "train") or the engine's ("engine") device
        memory where it is not so already, listing the call in `memory_calls`."""
        part = self.backend if side == "train" else self.engine
        if bool(part.offloaded) != on_device:
            return
        if on_device:
            part.onload()
            self._calls.append(f"{side}.onload")
        else:
            part.offload()
            self._calls.append(f"{side}.offload")
