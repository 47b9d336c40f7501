"""SGLang's distributed weight update, both ends: the process group the trainer (rank 0) and the rollout
engines (ranks 1..) form over TCP, and the buckets broadcast through it.

The protocol is SGLang's own (its `io_struct.py` request types and `ModelRunner`'s handlers):

- `POST /init_weights_update_group` `{master_address, master_port, rank_offset, world_size, group_name,
  backend}`: each engine rank joins as `rank_offset + tp_rank` of `world_size`, meeting rank 0 (the
  trainer, which serves the rendezvous store) at `tcp://master_address:master_port`; the group's store keys
  go under `group_name`.
- `POST /update_weights_from_distributed` `{names, dtypes, shapes, group_name, flush_cache,
  abort_all_requests, weight_version, load_format}`: the engine allocates the tensors the metadata
  describes and receives them by broadcast from rank 0: one broadcast per tensor in `names` order
  (`load_format` null), or one uint8 tensor holding every tensor's bytes back to back
  (`load_format: "flattened_bucket"`). `dtypes` are torch dtype names without `torch.` ("bfloat16").
- `POST /destroy_weights_update_group` `{group_name}`.

This module is the wire both sides speak, with no HTTP and no Ray: `TensorMeta` and `plan_buckets` (the
metadata, in `--update-weight-buffer-size` buckets), `pack`/`unpack` (the flattened format), `WeightGroup`
(join, send, receive, leave; gloo on CPU, NCCL on GPU, the same code) and `PushGate` (the go-ahead of one
push through the group's store, so that no rank sits in a broadcast while another engine is still busy).
The runtime's trainer side is `runtime.weight_sync.collective`; the engine side is that module's receiver
(engines in Ray actors), `engine_actor.HttpRolloutEngine` (engines behind SGLang's HTTP API) and our
server's routes (`server.py`). docs/adr/0014-collective-weight-sync.md has the design.
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

GROUP_NAME = "weight_update_group"  # SGLang's default group name
FLATTENED = "flattened_bucket"  # SGLang's load_format for one uint8 broadcast per bucket
LOAD_FORMATS = (None, FLATTENED)
DEFAULT_TIMEOUT_S = 600.0  # a rendezvous or one broadcast; longer means a rank is gone
DEFAULT_READY_TIMEOUT_S = 1800.0  # an engine may first finish the generations queued on it


class WeightGroupError(RuntimeError):
    """A weight-update group could not be formed, or a broadcast through it failed or timed out."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a push as the metadata names it: HF name, dtype name ("bfloat16"), shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype, f"dtype of {self.name!r}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's spelling: `torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str, field: str = "dtypes") -> torch.dtype:
    """A torch dtype from its name ("bfloat16" or "torch.bfloat16"); anything else is refused naming
    `field`."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{field}: {name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')")
    return value


def describe(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    """The metadata of (name, tensor) pairs, in order."""
    return [TensorMeta(name, dtype_name(t.dtype), tuple(int(d) for d in t.shape)) for name, t in named]


def plan_buckets(metas: Iterable[TensorMeta], bucket_bytes: int) -> list[list[TensorMeta]]:
    """The tensors in order, cut into buckets of at most `bucket_bytes` (`--update-weight-buffer-size`); a
    tensor larger than that travels alone. Names must be unique."""
    if bucket_bytes < 1:
        raise ValueError(f"update-weight-buffer-size must be at least 1 byte, got {bucket_bytes}")
    buckets: list[list[TensorMeta]] = []
    current: list[TensorMeta] = []
    held = 0
    seen: set[str] = set()
    for meta in metas:
        if meta.name in seen:
            raise ValueError(f"weight push names {meta.name!r} twice")
        seen.add(meta.name)
        if current and held + meta.nbytes > bucket_bytes:
            buckets.append(current)
            current, held = [], 0
        current.append(meta)
        held += meta.nbytes
    if current:
        buckets.append(current)
    return buckets


def metas_from_request(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[TensorMeta]:
    """SGLang's parallel lists -> metadata; unequal lengths, bad dtypes, negative dims and repeated
    names are refused naming the field."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(
            f"names, dtypes and shapes must have one entry per tensor: {len(names)}, {len(dtypes)}, {len(shapes)}"
        )
    metas = []
    for index, (name, dtype, shape) in enumerate(zip(names, dtypes, shapes, strict=True)):
        parse_dtype(dtype, f"dtypes[{index}]")
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"shapes[{index}]: {list(shape)} has a negative dimension")
        metas.append(TensorMeta(str(name), str(dtype).removeprefix("torch."), tuple(int(d) for d in shape)))
    if len({m.name for m in metas}) != len(metas):
        raise ValueError("names: a tensor is named twice")
    return metas


def pack(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The flattened format: every tensor's bytes back to back in one uint8 tensor on `device`."""
    flat = torch.empty(sum(t.numel() * t.element_size() for t in tensors), dtype=torch.uint8, device=device)
    offset = 0
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if size:
            flat[offset : offset + size].copy_(tensor.detach().contiguous().reshape(-1).view(torch.uint8))
        offset += size
    return flat


def unpack(flat: torch.Tensor, metas: Sequence[TensorMeta]) -> dict[str, torch.Tensor]:
    """The tensors of a flattened bucket, as views of it where the offsets allow (copies otherwise)."""
    total = sum(m.nbytes for m in metas)
    if total != flat.numel():
        raise ValueError(f"a flattened bucket of {flat.numel()} bytes holds {total} bytes of tensors")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for meta in metas:
        size, dtype = meta.nbytes, meta.torch_dtype
        piece = flat[offset : offset + size]
        if offset % dtype.itemsize:  # a view must start on an element boundary
            piece = piece.clone()
        out[meta.name] = piece.view(dtype).view(meta.shape)
        offset += size
    return out


@dataclass(frozen=True)
class JoinOrder:
    """What an engine is told to join a weight-update group: rank 0's store at `master_address:master_port`,
    its first rank (`rank_offset`; one rank per tensor-parallel rank) of `world_size`, the group's name and
    backend, the bound of the rendezvous and of each broadcast, and the member name its push gate and its
    errors use ("engine3")."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    member: str = "engine"


@dataclass(frozen=True)
class PushOrder:
    """What an engine is told before a push: the group, the push, its metadata (buckets of tensors in the
    order rank 0 broadcasts them), the version it brings and the version the engine must hold now."""

    group_name: str
    push_id: int
    buckets: tuple[tuple[TensorMeta, ...], ...]
    version: int
    expected: int
    load_format: str | None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    @property
    def tensors(self) -> int:
        return sum(len(b) for b in self.buckets)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for b in self.buckets for m in b)

    def what(self, member: str) -> str:
        return f"{member}: weight push {self.push_id} (version {self.version}, group {self.group_name!r})"


def _names(metas: Sequence[TensorMeta]) -> str:
    more = f" (+{len(metas) - 3} more)" if len(metas) > 3 else ""
    return f"{[m.name for m in metas[:3]]}{more}"


class WeightGroup:
    """One member's handle on a weight-update group: rank 0 (the trainer) sends, the others receive.

    Formed as SGLang forms it (`init_custom_process_group`): a TCP store at `master_address:master_port`
    (rank 0 serves it: `serve_store`), prefixed with the group name, and a process group of its own beside
    any default group the process has. gloo on CPU, NCCL on GPU. Every rendezvous and broadcast is bounded
    by `timeout_s`: a rank that is gone fails the others with a `WeightGroupError` instead of a hang (NCCL's
    watchdog ends the process instead, as its timeouts do)."""

    def __init__(self, name: str, rank: int, world_size: int, backend: str, group: Any, store: Any) -> None:
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.group = group
        self.store = store  # the raw TCP store (PushGate keeps its keys there)

    @staticmethod
    def serve_store(host: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """Rank 0's rendezvous store on a free port of this host (`store.port`)."""
        from torch.distributed import TCPStore

        return TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
        )

    @classmethod
    def join(
        cls,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str = GROUP_NAME,
        backend: str = "gloo",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        store: Any = None,
    ) -> WeightGroup:
        """Join as `rank` of `world_size` (rank 0 passes the store it serves). gloo returns once every rank
        has joined; NCCL connects at the first broadcast."""
        from torch.distributed import PrefixStore, TCPStore
        from torch.distributed import distributed_c10d as c10d

        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend: {backend!r} is not a weight-update backend (gloo, nccl)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend: nccl needs CUDA, and this process has none (use gloo)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        where = f"weight-update group {group_name!r} at {master_address}:{master_port} (rank {rank} of {world_size})"
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            if store is None:
                store = TCPStore(
                    master_address, int(master_port), is_master=False, wait_for_workers=False, timeout=timeout
                )
            group, _ = c10d._new_process_group_helper(
                world_size,
                rank,
                [],
                backend,
                PrefixStore(group_name, store),
                group_name=group_name,
                timeout=timeout,
            )
            c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
        except Exception as exc:  # noqa: BLE001 - one error type for callers, naming the group
            raise WeightGroupError(f"{where}: could not join: {exc}") from exc
        return cls(group_name, rank, world_size, backend, group, store)

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        import torch.distributed as dist

        try:
            dist.broadcast(tensor, group=self.group, group_src=0)
        except Exception as exc:  # noqa: BLE001
            raise WeightGroupError(
                f"weight-update group {self.name!r} (rank {self.rank} of {self.world_size}, {self.backend}): "
                f"broadcast of {what} failed: {exc}"
            ) from exc

    def send(
        self,
        metas: Sequence[TensorMeta],
        tensors: Sequence[torch.Tensor],
        *,
        device: torch.device,
        load_format: str | None,
    ) -> None:
        """Rank 0: broadcast one bucket (tensors in `metas` order) in `load_format`."""
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} of weight-update group {self.name!r} cannot send")
        if load_format == FLATTENED:
            if metas:
                self._broadcast(pack(tensors, device), f"a bucket of {_names(metas)}")
            return
        for meta, tensor in zip(metas, tensors, strict=True):
            self._broadcast(tensor.detach().to(device).contiguous(), repr(meta.name))

    def receive(
        self, metas: Sequence[TensorMeta], *, device: torch.device, load_format: str | None
    ) -> dict[str, torch.Tensor]:
        """Ranks 1..: one bucket as `metas` describe it, on `device`."""
        if load_format == FLATTENED:
            if not metas:
                return {}
            flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8, device=device)
            self._broadcast(flat, f"a bucket of {_names(metas)}")
            return unpack(flat, metas)
        if load_format is not None:
            raise ValueError(f"load_format: {load_format!r} is not one of {list(LOAD_FORMATS)}")
        out = {}
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=meta.torch_dtype, device=device)
            self._broadcast(tensor, repr(meta.name))
            out[meta.name] = tensor
        return out

    def leave(self) -> None:
        """Destroy this member's process group (the store's server, on rank 0, goes with the store)."""
        import torch.distributed as dist

        try:
            dist.destroy_process_group(self.group)
        except Exception:  # noqa: BLE001 - best effort: the group may be broken already
            pass


class PushGate:
    """The go-ahead of one push, through the group's store: each engine marks itself ready once it has
    finished what it was doing (its queued generations) and checked the push; rank 0 starts broadcasting
    once every engine is ready, and the engines wait for its go before receiving. So no rank waits inside a
    broadcast (bounded by the group's timeout) for an engine still busy generating; the wait for
    readiness has its own, longer bound. Any member may abort the push with a reason (a failed check, a
    timeout): everyone waiting raises it."""

    POLL_S = 0.02

    def __init__(self, store: Any, group_name: str, push_id: int) -> None:
        from torch.distributed import PrefixStore

        self.store = PrefixStore(f"relax-push/{group_name}/{push_id}/", store)
        self.push_id = push_id

    def ready(self, member: str) -> None:
        self.store.set(f"ready/{member}", "1")

    def abort(self, reason: str) -> None:
        self.store.set("abort", reason)

    def _aborted(self) -> str | None:
        return self.store.get("abort").decode() if self.store.check(["abort"]) else None

    def _raise_if_aborted(self) -> None:
        reason = self._aborted()
        if reason is not None:
            raise WeightGroupError(f"weight push {self.push_id} aborted: {reason}")

    def _give_up(self, reason: str) -> NoReturn:
        """Abort the push for every member (a wait that timed out), and raise."""
        self.abort(reason)
        raise WeightGroupError(f"weight push {self.push_id}: {reason}")

    def go(self) -> None:
        self.store.set("go", "1")

    def wait_ready(
        self, members: Sequence[str], timeout_s: float, cancelled: threading.Event | None = None
    ) -> None:
        """Rank 0: until every member is ready (raises on an abort, a cancel, or the timeout, which it
        posts as an abort naming the members that never came)."""
        deadline = time.monotonic() + timeout_s
        waiting = list(members)
        while waiting:
            self._raise_if_aborted()
            waiting = [m for m in waiting if not self.store.check([f"ready/{m}"])]
            if not waiting:
                return
            if cancelled is not None and cancelled.is_set():
                self.abort("the trainer cancelled it")
                raise WeightGroupError(f"weight push {self.push_id} cancelled")
            if time.monotonic() > deadline:
                self._give_up(f"{waiting} not ready to receive after {timeout_s:.0f} s")
            time.sleep(self.POLL_S)

    def wait_go(self, member: str, timeout_s: float) -> None:
        """An engine: until rank 0's go (raises on an abort or the timeout, which it posts as an abort)."""
        deadline = time.monotonic() + timeout_s
        while not self.store.check(["go"]):
            self._raise_if_aborted()
            if time.monotonic() > deadline:
                self._give_up(f"{member} got no go-ahead from the trainer after {timeout_s:.0f} s")
            time.sleep(self.POLL_S)


def gate_store(master_address: str, master_port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """A client of rank 0's store, for a `PushGate` kept by a process that is not itself a group member
    (the actor driving an engine server over HTTP)."""
    from torch.distributed import TCPStore

    return TCPStore(
        master_address,
        int(master_port),
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def receive_push(
    buckets: Sequence[Sequence[TensorMeta]],
    receive: Callable[[Sequence[TensorMeta]], Mapping[str, torch.Tensor]],
    apply: Callable[[int, Mapping[str, torch.Tensor]], None],
) -> None:
    """Receive every bucket and hand each to `apply(index, tensors)`. An `apply` that fails does not stop
    the receiving: the remaining buckets are received and dropped, so rank 0 and the other engines finish
    the push, and the first failure is raised after the last bucket."""
    failure: BaseException | None = None
    for index, bucket in enumerate(buckets):
        tensors = receive(bucket)
        if failure is not None:
            continue
        try:
            apply(index, tensors)
        except Exception as exc:  # noqa: BLE001 - raised below, once the push is drained
            failure = exc
    if failure is not None:
        raise failure
