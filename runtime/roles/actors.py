"""The role actor classes (Ray wraps them with `ray.remote`): trainer, rollout engines (in-process or
SGLang-protocol server), forward-only model, PPO's critic.

Each forwards its log records to the job's log sink (see `roles/logs.py`) and logs any exception a method
raises before Ray carries it to the driver.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.actor import ActorHandle

from runtime.devices import Device
from runtime.models.page_cache import warm_from_env
from runtime.roles.logs import install_actor_logging, log_exceptions
from runtime.rollout.params import GenerationResult, SamplingParams
from runtime.train.base import TrainBackend, TrainContext, train_backend_class
from runtime.weight_sync.collective import CollectiveWeightSource, CollectiveWeightTarget

if TYPE_CHECKING:
    from runtime.rollout.engine import TorchRolloutEngine
    from runtime.train.checkpoint import CheckpointRecord
    from runtime.train.critic import CriticConfig
    from runtime.train.torch_backend import TrainConfig
    from runtime.types import RolloutBatch

# Each role's process imports this module (Ray pickles the classes by reference), so what only one role
# needs (transformers' generate, the training and critic backends) is imported where that role starts: an
# HTTP engine actor then starts its server without first loading the training stack (~2 s of CPU). The HTTP
# engine actor itself (`HttpEngineActor`, on the SGLang client and httpx) is in runtime/roles/http_engine.py,
# so that every other role's process goes without those (~0.1 s of CPU each); `from runtime.roles.actors
# import HttpEngineActor` still finds it (`__getattr__` below).

log = logging.getLogger(__name__)


def _setup_process(num_threads: int, log_sink: ActorHandle | None, source: str) -> None:
    # Each actor gets a slice of the machine: more intra-op threads than its CPU share only oversubscribes.
    torch.set_num_threads(max(1, num_threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    install_actor_logging(log_sink, source)
    # `--warm-hf-checkpoint-page-cache`: the job's checkpoints read once per node before a role loads them
    warm_from_env()


def _prepare_megatron_rank() -> None:
    """A megatron-core rank's process imports megatron-core without its W&B and TensorBoard loggers (and, on
    CPU, without compiling its fusions): `runtime.train.megatron.startup`. Ray workers only."""
    from runtime.train.megatron.startup import prepare_rank_process

    prepare_rank_process()


def _placement_group_id() -> str | None:
    pg = ray.util.get_current_placement_group()
    return None if pg is None else pg.id.hex()


def free_loopback_port(avoid: tuple[int, ...] = ()) -> tuple[str, int]:
    """A free TCP port on this node's loopback, for a multi-rank role's rendezvous (run in rank 0's slot,
    before any rank starts: every rank gets it as a constructor argument). `avoid`: ports already handed
    to another group of the job, free until its rank 0 binds them, so the OS may offer them again."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return "127.0.0.1", port


def _ready_info(role: str, **facts: Any) -> dict[str, Any]:
    """What a role actor's `ready()` answers: its role, the facts given, its pid and placement group."""
    return {"role": role, **facts, "pid": os.getpid(), "placement_group": _placement_group_id()}


@log_exceptions
class TrainActor(CollectiveWeightSource):
    """The `actor` role: owns a training backend (policy, optimizer, reference model when colocated).
    Rank 0 is the sender of the collective weight sync (`CollectiveWeightSource`: `weight_group_*`,
    `weight_push_*`).

    A multi-rank backend (megatron) runs one TrainActor per rank: `rank` of `world_size`, meeting the
    others at `master_addr:master_port` (picked on rank 0's node before any rank started), with the job's
    parameters in `values`."""

    def __init__(
        self,
        backend: str,
        hf_checkpoint: str,
        config: TrainConfig,
        *,
        need_ref: bool,
        num_threads: int = 1,
        log_sink: ActorHandle | None = None,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        _setup_process(num_threads, log_sink, "actor:train" if world_size == 1 else f"actor:train{rank}")
        started = time.perf_counter()
        self.rank = rank
        if backend == "megatron":
            _prepare_megatron_rank()
        backend_cls = train_backend_class(backend)
        context = TrainContext(
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            values=dict(values or {}),
        )
        self.backend: TrainBackend = backend_cls(
            hf_checkpoint, config, device=Device.detect(), need_ref=need_ref, context=context
        )
        log.info(
            "%s train backend ready in %.1fs (pid %d, rank %d of %d, reference model: %s)",
            backend,
            time.perf_counter() - started,
            os.getpid(),
            rank,
            world_size,
            need_ref,
        )

    def ready(self) -> dict[str, Any]:
        return _ready_info(
            "actor", rank=self.rank, device=str(Device.detect().kind), threads=torch.get_num_threads()
        )

    def compute_log_probs(self, batch: RolloutBatch, old: bool = True, ref: bool = True) -> RolloutBatch:
        return self.backend.compute_log_probs(batch, old=old, ref=ref)

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return self.backend.train_step(batch)

    def evaluate_nll(self, batch: RolloutBatch) -> tuple[float, int]:
        return self.backend.evaluate_nll(batch)

    def update_reference(self) -> None:
        self.backend.update_reference()

    def named_weights(self) -> dict[str, torch.Tensor]:
        return self.backend.named_weights()

    def parameter_checksum(self) -> float:
        return self.backend.parameter_checksum()

    def offload(self) -> None:
        self.backend.offload()

    def onload(self) -> None:
        self.backend.onload()

    def save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], blocking: bool = True
    ) -> CheckpointRecord | None:
        return self.backend.save_checkpoint(save_dir, iteration, extra_state, blocking=blocking)

    def finished_saves(self, wait: bool = False) -> list[CheckpointRecord]:
        return self.backend.finished_saves(wait=wait)

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        return self.backend.load_checkpoint(load_dir)

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord:
        return self.backend.export_hf(out_dir, step)


@log_exceptions
class RolloutEngineActor(CollectiveWeightTarget):
    """The `rollout` role: one built-in torch engine holding its own copy of the policy. Takes weights from
    the object store (`load_weights`) or over the collective weight sync (`CollectiveWeightTarget`)."""

    def __init__(
        self,
        hf_checkpoint: str,
        *,
        engine_index: int,
        num_threads: int = 1,
        max_batch_size: int = 256,
        log_sink: ActorHandle | None = None,
    ) -> None:
        _setup_process(num_threads, log_sink, f"actor:rollout{engine_index}")
        self.engine_index = engine_index
        started = time.perf_counter()
        from runtime.rollout.backend import in_process_engine

        # TorchRolloutEngine, or FastGenEngine with RELAX_ROLLOUT_BACKEND=fastgen (the same interface)
        self.engine: TorchRolloutEngine = in_process_engine(
            hf_checkpoint, device=Device.detect(), max_batch_size=max_batch_size
        )
        log.info(
            "rollout engine %d ready in %.1fs (pid %d)",
            engine_index,
            time.perf_counter() - started,
            os.getpid(),
        )

    def ready(self) -> dict[str, Any]:
        return _ready_info("rollout", engine_index=self.engine_index, threads=torch.get_num_threads())

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        return self.engine.generate(prompts, params, budgets)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> int:
        from runtime.rollout.backend import load_versioned_weights

        load_versioned_weights(self.engine, named_tensors, version)
        return version

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()


@log_exceptions
class CriticActor:
    """The `critic` role (PPO): a value model with its own optimizer, on devices of its own, on the job's
    train backend. Under `megatron` it is one rank of the critic's own process group (never the policy's:
    the two train at the same time), `rank` of `world_size`, meeting the others at `master_addr:master_port`
    as the trainer's ranks do; a one-rank critic runs with the model-parallel sizes set to 1
    (`critic.critic_context`), and picks its port here when none was given."""

    def __init__(
        self,
        model_path: str,
        config: CriticConfig,
        *,
        backend: str = "torch",
        hf_checkpoint: str | None = None,
        values: Mapping[str, Any] | None = None,
        num_threads: int = 1,
        log_sink: ActorHandle | None = None,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
    ) -> None:
        _setup_process(num_threads, log_sink, "actor:critic" if world_size == 1 else f"actor:critic{rank}")
        started = time.perf_counter()
        self.backend_name = backend
        self.rank = rank
        self.backend: Any
        if backend == "megatron":
            _prepare_megatron_rank()
            from runtime.train.megatron.critic import MegatronCriticBackend, critic_context

            if master_port is None:
                master_addr, master_port = free_loopback_port()
            context = critic_context(rank, world_size, master_addr, master_port, values or {})
            self.backend = MegatronCriticBackend(
                model_path, config, device=Device.detect(), context=context, hf_checkpoint=hf_checkpoint
            )
        elif world_size != 1:
            raise ValueError(f"the {backend} critic runs in one process, not {world_size} ranks")
        else:
            from runtime.train.critic import TorchCriticBackend

            self.backend = TorchCriticBackend(model_path, config, device=Device.detect())
        log.info(
            "%s critic ready from %s in %.1fs (pid %d, rank %d of %d)",
            backend,
            model_path,
            time.perf_counter() - started,
            os.getpid(),
            rank,
            world_size,
        )

    def ready(self) -> dict[str, Any]:
        return _ready_info("critic", rank=self.rank, backend=self.backend_name)

    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        return self.backend.compute_values(batch)

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return self.backend.train_step(batch)

    def save_checkpoint(self, root: str, iteration: int) -> CheckpointRecord | None:
        return self.backend.save_checkpoint(root, iteration)

    def load_checkpoint(self, root: str) -> int | None:
        return self.backend.load_checkpoint(root)


@log_exceptions
class ForwardActor:
    """The `reference` / `actor_fwd` roles when they have devices of their own: one model, forward only."""

    def __init__(
        self,
        role: str,
        model_path: str,
        *,
        temperature: float,
        num_threads: int = 1,
        log_sink: ActorHandle | None = None,
    ) -> None:
        _setup_process(num_threads, log_sink, f"actor:{role}")
        self.role = role
        from runtime.train.forward import LogProbModel

        self.model = LogProbModel(model_path, device=Device.detect(), temperature=temperature)
        log.info("%s model ready from %s (pid %d)", role, model_path, os.getpid())

    def ready(self) -> dict[str, Any]:
        return _ready_info(self.role)

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        return self.model.log_probs(batch)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> int:
        self.model.load_weights(named_tensors, version)
        return version


def __getattr__(name: str) -> Any:
    """`HttpEngineActor`, imported from runtime/roles/http_engine.py only when asked for."""
    if name == "HttpEngineActor":
        from runtime.roles.http_engine import HttpEngineActor

        return HttpEngineActor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
