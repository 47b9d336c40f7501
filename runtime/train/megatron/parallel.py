"""The parallel layout of a Megatron job and the process-group / `parallel_state` start and teardown."""

from __future__ import annotations

import datetime
import functools
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.train.megatron.cpu import install_cpu_shims

# Megatron's flag for each layout field, for error messages (dests are the spec's keys).
FLAGS = {
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "vpp": "--num-virtual-stages-per-pipeline-rank",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
}


@dataclass(frozen=True)
class ParallelLayout:
    """How `world_size` ranks split a model: tensor (tp), pipeline (pp, with `vpp` virtual stages per
    pipeline rank, None = no interleaving), context (cp), expert (ep, with expert-tensor size etp, None =
    tp) parallelism; data parallelism (`dp`) takes what is left. Megatron's rank order is
    tp-cp-ep-dp-pp. `sequence_parallel` is dropped when tp == 1, as Megatron-LM does."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool = False
    world_size: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = FLAGS.get(name, "world size")
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        for name in ("vpp", "etp"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{FLAGS[name]} must be a positive integer, got {value!r}")
        if self.vpp == 1:
            object.__setattr__(self, "vpp", None)  # one virtual stage per rank is no interleaving
        if self.tp == 1 and self.sequence_parallel:
            object.__setattr__(self, "sequence_parallel", False)
        world = self.world_size
        for name in ("tp", "pp", "cp"):
            if world % getattr(self, name):
                raise ValueError(f"{FLAGS[name]} {getattr(self, name)} does not divide world size {world}")
        if world % self.model_parallel_size:
            raise ValueError(
                f"{FLAGS['tp']} {self.tp} x {FLAGS['pp']} {self.pp} x {FLAGS['cp']} {self.cp} "
                f"= {self.model_parallel_size} does not divide world size {world}"
            )
        if self.vpp is not None and self.pp == 1:
            raise ValueError(f"{FLAGS['vpp']} {self.vpp} needs {FLAGS['pp']} > 1")
        expert_ranks = self.expert_tp * self.ep * self.pp
        if world % expert_ranks:
            raise ValueError(
                f"{FLAGS['ep']} {self.ep} x {FLAGS['etp']} {self.expert_tp} x {FLAGS['pp']} {self.pp} "
                f"= {expert_ranks} does not divide world size {world}"
            )

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel size: the ranks left once a model replica (tp x pp x cp) is placed."""
        return self.world_size // self.model_parallel_size

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def virtual_stages(self) -> int:
        """Model chunks per pipeline rank (1 without interleaving)."""
        return self.vpp or 1

    @classmethod
    def from_values(
        cls, values: Mapping[str, Any], world_size: int, *, num_layers: int | None = None
    ) -> ParallelLayout:
        """The layout the spec's Megatron values (by dest) ask for on `world_size` ranks.

        `--num-layers-per-virtual-pipeline-stage` needs the layer count (`num_layers`, else
        `values["num_layers"]`) to turn into virtual stages per pipeline rank."""

        def get(dest: str, default: Any) -> Any:
            value = values.get(dest)
            return default if value is None else value

        pp = int(get("pipeline_model_parallel_size", 1))
        stages = values.get("num_virtual_stages_per_pipeline_rank")
        per_stage = values.get("num_layers_per_virtual_pipeline_stage")
        if stages is not None and per_stage is not None:
            raise ValueError(
                "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are "
                "mutually exclusive; set one"
            )
        vpp = int(stages) if stages is not None else None
        if per_stage is not None:
            layers = num_layers if num_layers is not None else values.get("num_layers")
            if layers is None:
                raise ValueError(
                    "--num-layers-per-virtual-pipeline-stage needs --num-layers (or a config.json)"
                )
            if int(layers) % (pp * int(per_stage)):
                raise ValueError(
                    f"--num-layers {layers} is not a multiple of {FLAGS['pp']} {pp} x "
                    f"--num-layers-per-virtual-pipeline-stage {per_stage}"
                )
            vpp = int(layers) // (pp * int(per_stage))
        etp = values.get("expert_tensor_parallel_size")
        return cls(
            tp=int(get("tensor_model_parallel_size", 1)),
            pp=pp,
            vpp=vpp,
            cp=int(get("context_parallel_size", 1)),
            ep=int(get("expert_model_parallel_size", 1)),
            etp=None if etp is None else int(etp),
            sequence_parallel=bool(get("sequence_parallel", False)),
            world_size=world_size,
        )

    def check_layers(self, num_layers: int) -> None:
        """Raise unless `num_layers` splits evenly over pipeline stages and virtual stages."""
        chunks = self.pp * self.virtual_stages
        if num_layers % chunks:
            what = f"{FLAGS['pp']} {self.pp}" + (f" x {FLAGS['vpp']} {self.vpp}" if self.vpp else "")
            raise ValueError(f"--num-layers {num_layers} is not a multiple of {what}")


def cp_columns(width: int, cp: int, rank: int) -> torch.Tensor:
    """The sequence positions context-parallel rank `rank` of `cp` holds of a sequence of `width` (a multiple
    of 2 x cp): megatron's load-balanced layout, chunks `rank` and `2 cp - 1 - rank` of the 2 x cp equal
    chunks (the order its RoPE slices the frequencies in, `get_pos_emb_on_this_cp_rank`)."""
    if width % (2 * cp):
        raise ValueError(f"a width of {width} does not split into 2 x {FLAGS['cp']} {cp} chunks")
    chunk = width // (2 * cp)
    first, second = rank * chunk, (2 * cp - 1 - rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


def cp_gathered_columns(width: int, cp: int) -> torch.Tensor:
    """The sequence position of each row of the context-parallel ranks' parts concatenated in rank order
    (what an all-gather over the context-parallel group returns): `cp_columns` of rank 0, 1, ..."""
    return torch.cat([cp_columns(width, cp, rank) for rank in range(cp)])


def cp_packed_columns(seqlens: Sequence[int], cp: int, rank: int) -> torch.Tensor:
    """The positions of a pack (`thd`: sequences of `seqlens` tokens, each a multiple of 2 x cp, laid end to
    end) that context-parallel rank `rank` holds, in its order: `cp_columns` of every sequence, offset by the
    sequence's start (megatron's and TransformerEngine's layout for packed sequences under CP; a padded
    `bshd` micro-batch is one sequence of its width)."""
    parts, start = [], 0
    for length in seqlens:
        parts.append(cp_columns(int(length), cp, rank) + start)
        start += int(length)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


@functools.lru_cache(maxsize=256)
def cp_sequence_order(seqlens: tuple[int, ...], cp: int) -> torch.Tensor:
    """The index that puts what an all-gather over the context-parallel group returns (each rank's
    `cp_packed_columns` of the sequences `seqlens`, in rank order) back in sequence order. Cached: every layer
    and the loss head of a micro-batch ask for the same one; callers must not modify it."""
    return torch.argsort(torch.cat([cp_packed_columns(seqlens, cp, r) for r in range(cp)]))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on the loopback interface right now (for rank 0 to rendezvous on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_minutes: int = 10,
    *,
    local_rank: int | None = None,
) -> str:
    """Join the job's default process group over TCP: NCCL (after selecting this rank's GPU: `local_rank`,
    else `rank` modulo the visible GPUs) when CUDA is available, gloo otherwise. Returns the backend."""
    if torch.cuda.is_available():
        backend = "nccl"
        device = rank % torch.cuda.device_count() if local_rank is None else local_rank
        torch.cuda.set_device(device)
    else:
        backend = "gloo"
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{int(master_port)}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )
    return backend


def initialize_parallel(layout: ParallelLayout, seed: int, *, timeout_minutes: int = 10) -> None:
    """Megatron's model-parallel groups for `layout` and its RNG tracker, over the default process group
    (`init_process_group` first). Installs the CPU shims when CUDA is absent. On CPU every layout runs over
    gloo: torch 2.13's gloo has the all-to-all and reduce-scatter that expert, sequence and context
    parallelism use (measured; tests/unit/runtime/megatron/test_parallel.py)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mp_random

    if not dist.is_initialized():
        raise RuntimeError("initialize_parallel: call init_process_group() first")
    if dist.get_world_size() != layout.world_size:
        raise ValueError(
            f"the layout is for {layout.world_size} ranks but the process group has {dist.get_world_size()}"
        )
    on_cpu = install_cpu_shims()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        distributed_timeout_minutes=timeout_minutes,
    )
    torch.manual_seed(seed)
    if on_cpu:
        # The default tracker forks CUDA generator states, which a CPU build does not have.
        mp_random.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
    else:
        mp_random.model_parallel_cuda_manual_seed(seed)


def destroy_parallel(*, process_group: bool = True) -> None:
    """Tear down megatron's groups and (unless `process_group=False`) the default process group."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if process_group and dist.is_initialized():
        dist.destroy_process_group()
