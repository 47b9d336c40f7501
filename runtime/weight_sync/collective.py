"""Weight sync over a collective (`--update-weight-backend nccl`, `RELAX_WEIGHT_SYNC=nccl`): the trainer's
rank 0 broadcasts its weights, under Hugging Face names, to every rollout engine over a process group of
their own, in buckets of `--update-weight-buffer-size` bytes. NCCL where the trainer runs on GPU, gloo on
CPU: the same code. The wire is SGLang's distributed weight update (`runtime.rollout.sglang.weight_group`),
so an engine behind SGLang's HTTP API (SGLang itself, or our server) takes the same broadcast through its
own `/init_weights_update_group` and `/update_weights_from_distributed`.

Three sides:

- **driver** (`CollectiveWeightSync`): forms one group per engine set (the trainer's rank 0 opens a TCP
  store on a free port of its node; every engine joins at its rank offset), then for each push asks the
  trainer to gather and describe its weights (the metadata: names, dtypes, shapes, in buckets), hands that
  metadata and the version to every engine by a Ray call, and tells rank 0 to send. Receivers it cannot
  reach this way (forward-only roles, engines hosted by the trainer, engines a supervisor or an autoscaler
  may replace or add) go through the object store (`ObjectStoreWeightSync`).
- **trainer** (`CollectiveWeightSource`, mixed into `TrainActor`): every rank takes part in the gather
  (`named_weights`, a collective under megatron); rank 0 keeps the copy and broadcasts it from a worker
  thread of its own, so the actor is free to train while the engines finish their queued generations.
- **engine** (`CollectiveWeightTarget`, mixed into the in-process `RolloutEngineActor`; the HTTP engines'
  actor does the same over HTTP): checks the push before anything moves (it must hold the version the
  driver last gave it, and the metadata must name every tensor it holds, with its shape), then receives
  each bucket and applies it (`FastGenEngine.load_weight_bucket`, or one `load_weights` for the HF engine);
  `finish_weight_update` refuses a missing tensor, and only then is the version taken.

No side waits forever: a rendezvous and each broadcast are bounded by `timeout_s`; the wait for every
engine to be ready (done generating) by `ready_timeout_s`, through the group's store (`PushGate`), so no
rank sits in a broadcast while another engine is still busy. A failed check aborts the push for everyone
before a byte moves; a failure while applying a bucket lets the engine receive the rest (so the others
finish) and then raises. Errors name the group (the Ray job's id and the engine set), the engine, the
push's version and the tensors. Rank 0 times each push's parts (the gather, the wait for the engines, the
copies to its device, the broadcasts): `CollectiveWeightSync.last_push_timings` (bench/gpu_weight_sync.py).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from runtime.rollout.sglang.weight_group import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    FLATTENED,
    JoinOrder,
    PushGate,
    PushOrder,
    TensorMeta,
    WeightGroup,
    describe,
    pack,
    plan_buckets,
    receive_push,
)
from runtime.weight_sync.base import (
    WEIGHT_SYNC_BACKENDS,
    WeightReceiver,
    WeightSync,
    WeightSyncBackend,
    push_split,
)
from runtime.weight_sync.object_store import ObjectStoreWeightSync

if TYPE_CHECKING:
    import ray

    from runtime.roles.groups import TrainGroup

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 * 1024**2  # `--update-weight-buffer-size`'s default


class WeightPushError(RuntimeError):
    """A push refused by an engine's checks, or failed while its buckets were applied."""


# -- the engine's side ---------------------------------------------------------------------------------------------


def engine_tensors(engine: Any) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(every tensor the engine must get, with its shape; names it accepts and ignores: a tied lm_head)."""
    weights = getattr(engine, "weights", None)
    if weights is not None and hasattr(weights, "optional_names"):  # FastGenEngine's flat weights
        return {name: tuple(slot.shape) for name, slot in weights.hf.items()}, set(weights.optional_names())
    model = engine.model  # TorchRolloutEngine
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    optional = {"lm_head.weight"} if tied else set()
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items() if n not in optional}
    return shapes, optional


def check_push(engine: Any, order: PushOrder, member: str) -> str | None:
    """Why `engine` must refuse `order` before anything moves (None: it may take it): it does not hold the
    version the driver expects, the version goes back, or the metadata misses, adds or misshapes a tensor."""
    held = int(engine.weight_version)
    if held != order.expected:
        return f"{order.what(member)}: the engine holds version {held}, the driver expected {order.expected}"
    if order.version < order.expected:
        return f"{order.what(member)}: older than the engine's version {held}"
    if getattr(engine, "offloaded", False):
        return f"{order.what(member)}: the engine's weights are offloaded (onload first)"
    want, optional = engine_tensors(engine)
    sent = {m.name: m for bucket in order.buckets for m in bucket}
    missing = sorted(set(want) - set(sent))
    unknown = sorted(set(sent) - set(want) - optional)
    misshapen = [
        f"{name} {sent[name].shape} != {want[name]}"
        for name in sorted(set(sent) & set(want))
        if sent[name].shape != want[name]
    ]
    for label, names in (
        ("is missing", missing),
        ("names unknown tensors", unknown),
        ("has wrong shapes", misshapen),
    ):
        if names:
            more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
            return f"{order.what(member)} {label}: {names[:3]}{more}"
    return None


def apply_push(
    engine: Any,
    order: PushOrder,
    receive: Callable[[Sequence[TensorMeta]], Mapping[str, torch.Tensor]],
    member: str = "engine",
) -> int:
    """Receive every bucket of a checked push into `engine` and take `order.version`. fastgen applies
    bucket by bucket (`start_weight_update` / `load_weight_bucket` / `finish_weight_update`, which refuses a
    missing tensor); the HF engine gets one full `load_weights`. A failure while applying still receives
    the remaining buckets (`receive_push`), then raises naming the push and the tensors."""
    bucketed = hasattr(engine, "start_weight_update")
    collected: dict[str, torch.Tensor] = {}
    if bucketed:
        engine.start_weight_update(engine.weight_version + 1)  # fastgen's own count; the driver's below

    def apply(index: int, tensors: Mapping[str, torch.Tensor]) -> None:
        try:
            if bucketed:
                engine.load_weight_bucket(tensors)
            else:
                collected.update(tensors)
        except (KeyError, ValueError, RuntimeError) as exc:
            names = list(tensors)[:3]
            raise WeightPushError(
                f"{order.what(member)}: bucket {index} ({names} ...) refused: {exc}"
            ) from exc

    receive_push(order.buckets, receive, apply)
    try:
        if bucketed:
            engine.finish_weight_update()
        else:
            engine.load_weights(collected, order.version)
    except (KeyError, ValueError) as exc:
        raise WeightPushError(f"{order.what(member)}: {str(exc).strip(chr(39))}") from exc
    engine.weight_version = order.version
    return order.version


def _receive_device(backend: str, engine_device: torch.device) -> torch.device:
    return engine_device if backend == "nccl" else torch.device("cpu")


class CollectiveWeightTarget:
    """The engine's side, for a rollout actor holding its engine as `self.engine` (`RolloutEngineActor`):
    joins the driver's group, then takes each push (see the module docstring)."""

    engine: Any
    engine_index: int
    _weight_group: WeightGroup | None = None
    _weight_member: str = "engine"

    def weight_group_info(self) -> dict[str, Any]:
        """This engine's ranks in a weight-update group and the payload formats it takes."""
        return {"ranks": 1, "load_formats": [FLATTENED, None], "engine_index": self.engine_index}

    def weight_group_join(self, order: JoinOrder) -> None:
        self.weight_group_leave()
        self._weight_member = order.member
        self._weight_group = WeightGroup.join(
            master_address=order.master_address,
            master_port=order.master_port,
            rank=order.rank_offset,
            world_size=order.world_size,
            group_name=order.group_name,
            backend=order.backend,
            timeout_s=order.timeout_s,
        )

    def weight_push_receive(self, order: PushOrder) -> int:
        """Check, wait for the trainer's go, receive and apply; returns the version now held."""
        group = self._weight_group
        member = self._weight_member
        if group is None or group.name != order.group_name:
            raise WeightPushError(
                f"{order.what(member)}: this engine is not in that group (joined: {group and group.name})"
            )
        gate = PushGate(group.store, group.name, order.push_id)
        problem = check_push(self.engine, order, member)
        if problem is not None:
            gate.abort(problem)  # before a byte moves: every member stops
            raise WeightPushError(problem)
        gate.ready(member)
        gate.wait_go(member, order.ready_timeout_s)
        device = _receive_device(group.backend, self.engine.torch_device)
        with torch.no_grad():
            return apply_push(
                self.engine,
                order,
                lambda metas: group.receive(metas, device=device, load_format=order.load_format),
                member,
            )

    def weight_group_leave(self, group_name: str | None = None) -> None:
        group = self._weight_group
        if group is not None and (group_name is None or group.name == group_name):
            self._weight_group = None
            group.leave()


# -- the trainer's side --------------------------------------------------------------------------------------------

TIMINGS_KEPT = 8  # pushes whose timings rank 0 keeps (`WeightSender.timings`)


def stage_bucket(
    index: int,
    bucket: Sequence[TensorMeta],
    tensors: Sequence[torch.Tensor],
    device: torch.device,
    load_format: str | None,
) -> tuple[list[TensorMeta], list[torch.Tensor]]:
    """One bucket on the sending device, as the broadcasts that carry it: the flattened format's one uint8
    tensor of every tensor's bytes back to back (`pack`: what SGLang's receivers allocate and take), or each
    tensor (per-tensor format). `WeightGroup.send` broadcasts the result as is (`load_format=None`), so the
    copies to the device are done, and timed, before the broadcast starts."""
    if load_format == FLATTENED:
        flat = pack(tensors, device)
        names = [m.name for m in bucket[:3]]
        more = f" (+{len(bucket) - 3} more)" if len(bucket) > 3 else ""
        return [TensorMeta(f"bucket {index} {names}{more}", "uint8", (flat.numel(),))], [flat]
    return list(bucket), [t.detach().to(device).contiguous() for t in tensors]


def _settle(device: torch.device) -> None:
    """Wait until the work queued on the sending stream (copies; a broadcast, which it waits for) is done."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class WeightSender:
    """Rank 0 of the trainer: serves the group's store, joins it, and sends prepared pushes in order from
    one worker thread (the actor's own thread stays free)."""

    def __init__(self, group_name: str, timeout_s: float, host: str | None = None) -> None:
        if host is None:  # this node's address: engines on other nodes connect to it
            import ray

            host = ray.util.get_node_ip_address()
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.host = host
        self.store = WeightGroup.serve_store(self.host, timeout_s)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.cuda_device = torch.cuda.current_device() if self.backend == "nccl" else None
        self.cancelled = threading.Event()
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-send")
        self._group: concurrent.futures.Future[WeightGroup] | None = None
        self._prepared: dict[int, tuple[list[list[TensorMeta]], dict[str, torch.Tensor]]] = {}
        self._sends: dict[int, concurrent.futures.Future[None]] = {}
        self._timings: dict[int, dict[str, float]] = {}  # the last TIMINGS_KEPT pushes' (`timings`)

    @property
    def address(self) -> tuple[str, int, str]:
        return self.host, int(self.store.port), self.backend

    def join(self, world_size: int) -> None:
        def join() -> WeightGroup:
            if self.cuda_device is not None:
                torch.cuda.set_device(self.cuda_device)
            return WeightGroup.join(
                master_address=self.host,
                master_port=int(self.store.port),
                rank=0,
                world_size=world_size,
                group_name=self.group_name,
                backend=self.backend,
                timeout_s=self.timeout_s,
                store=self.store,
            )

        self._group = self._worker.submit(join)

    def prepare(
        self,
        push_id: int,
        weights: Mapping[str, torch.Tensor],
        bucket_bytes: int,
        gather_s: float = 0.0,
    ) -> list[list[TensorMeta]]:
        named = {name: tensor.detach() for name, tensor in weights.items()}
        plan = plan_buckets(describe(named.items()), bucket_bytes)
        self._prepared = {
            push_id: (plan, named)
        }  # one push in flight at a time (the pipeline awaits the last)
        self._timings[push_id] = {
            "tensors": float(len(named)),
            "buckets": float(len(plan)),
            "bytes": float(sum(m.nbytes for bucket in plan for m in bucket)),
            "gather_s": gather_s,
        }
        for old in sorted(self._timings)[:-TIMINGS_KEPT]:
            del self._timings[old]
        return plan

    def send(
        self, push_id: int, members: Sequence[str], ready_timeout_s: float, load_format: str | None
    ) -> None:
        if self._group is None:
            raise RuntimeError(f"weight push {push_id}: rank 0 never joined group {self.group_name!r}")
        if push_id not in self._prepared:
            raise RuntimeError(f"weight push {push_id} was not prepared on rank 0")
        plan, named = self._prepared.pop(push_id)
        group_future = self._group
        record = self._timings.setdefault(push_id, {})

        def send() -> None:
            began = time.perf_counter()
            group = group_future.result()
            gate = PushGate(group.store, group.name, push_id)
            gate.wait_ready(members, ready_timeout_s, self.cancelled)
            gate.go()
            record["wait_s"] = time.perf_counter() - began
            device = (
                torch.device("cuda", self.cuda_device)
                if self.cuda_device is not None
                else torch.device("cpu")
            )
            staging = broadcast = 0.0
            with torch.no_grad():
                for index, bucket in enumerate(plan):
                    start = time.perf_counter()
                    metas, tensors = stage_bucket(
                        index, bucket, [named[m.name] for m in bucket], device, load_format
                    )
                    _settle(device)
                    staged = time.perf_counter()
                    group.send(metas, tensors, device=device, load_format=None)  # staged: as is
                    _settle(device)
                    staging += staged - start
                    broadcast += time.perf_counter() - staged
            record.update(h2d_s=staging, broadcast_s=broadcast, send_s=time.perf_counter() - began)

        self._sends = {k: f for k, f in self._sends.items() if not f.done()}
        self._sends[push_id] = self._worker.submit(send)

    def timings(self, push_id: int, timeout_s: float) -> dict[str, float] | None:
        """Push `push_id` as rank 0 saw it, in seconds (None: unknown, or no longer kept), once its send
        ended (or after `timeout_s`: the parts done by then): `gather_s` (`named_weights`, the gather to host
        memory), `wait_s` (from the send's start until the group was formed and every engine was ready),
        `h2d_s` (staging the buckets on the sending device: the host-to-device copies and the packing),
        `broadcast_s` (the broadcasts, until every engine had taken each bucket: the engines' applying of
        the bucket before included), `send_s` (the send, start to last byte); with `tensors`, `buckets` and
        `bytes`. On CUDA each part ends with a synchronise of the sending stream, so each is its own."""
        future = self._sends.get(push_id)
        if future is not None:
            concurrent.futures.wait([future], timeout=timeout_s)
        record = self._timings.get(push_id)
        return None if record is None else dict(record)

    def error(self, push_id: int, timeout_s: float) -> str | None:
        future = self._sends.get(push_id)
        if future is None:
            return None
        try:
            future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            return f"rank 0 is still sending push {push_id}"
        except Exception as exc:  # noqa: BLE001 - reported, not raised: the engines' error is the driver's
            return f"rank 0: {exc}"
        return None

    def close(self) -> None:
        """Cancel the sends still waiting for their engines, then leave the group on the worker thread,
        after a broadcast in progress ends (never under it); returns at once."""
        self.cancelled.set()
        group = self._group

        def leave() -> None:
            if group is not None and group.done() and group.exception() is None:
                group.result().leave()

        self._worker.submit(leave)
        self._worker.shutdown(wait=False)


class CollectiveWeightSource:
    """The trainer's side, for an actor with `named_weights()` and `rank` (`TrainActor`): rank 0 runs a
    `WeightSender`; every rank takes part in `weight_push_prepare` (the gather)."""

    rank: int
    _weight_sender: WeightSender | None = None

    def named_weights(self) -> dict[str, torch.Tensor]:  # pragma: no cover - the actor's own
        raise NotImplementedError

    def weight_group_open(
        self, group_name: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[str, int, str]:
        """Rank 0: (host, port, backend) of a new group's store, on a free port of this node."""
        self.weight_group_close()
        self._weight_sender = WeightSender(group_name, timeout_s)
        return self._weight_sender.address

    def weight_group_join(self, world_size: int) -> None:
        """Rank 0 joins on its worker thread (gloo returns once every engine has joined); returns at once."""
        self._sender().join(world_size)

    def weight_push_prepare(self, push_id: int, bucket_bytes: int) -> list[list[TensorMeta]]:
        """Every rank (the gather is a collective under megatron); rank 0 keeps the weights and answers the
        push's metadata, in buckets."""
        began = time.perf_counter()
        weights = self.named_weights()
        if self.rank != 0:
            return []
        if not weights:
            raise RuntimeError(f"weight push {push_id}: the trainer has no weights to push")
        return self._sender().prepare(push_id, weights, bucket_bytes, time.perf_counter() - began)

    def weight_push_send(
        self, push_id: int, members: list[str], ready_timeout_s: float, load_format: str | None
    ) -> None:
        """Rank 0: queue the broadcast (it starts once every engine is ready); returns at once."""
        self._sender().send(push_id, members, ready_timeout_s, load_format)

    def weight_push_error(self, push_id: int, timeout_s: float = 5.0) -> str | None:
        """Rank 0: why push `push_id` failed on this side (None: it did not, or is unknown)."""
        return None if self._weight_sender is None else self._weight_sender.error(push_id, timeout_s)

    def weight_push_timings(self, push_id: int, timeout_s: float = 5.0) -> dict[str, float] | None:
        """Rank 0: how long push `push_id`'s parts took (`WeightSender.timings`)."""
        return None if self._weight_sender is None else self._weight_sender.timings(push_id, timeout_s)

    def weight_group_close(self) -> None:
        sender, self._weight_sender = self._weight_sender, None
        if sender is not None:
            sender.close()

    def _sender(self) -> WeightSender:
        if self._weight_sender is None:
            raise RuntimeError("no weight-update group: weight_group_open first")
        return self._weight_sender


# -- the driver's side ---------------------------------------------------------------------------------------------


@dataclass
class _Session:
    key: tuple[str, ...]
    name: str
    members: list[str]
    load_format: str | None
    last: list[Any] = field(default_factory=list)  # the last push's refs


@WEIGHT_SYNC_BACKENDS.register(WeightSyncBackend.COLLECTIVE)
class CollectiveWeightSync(WeightSync):
    """See the module docstring. `bucket_bytes`: `--update-weight-buffer-size`."""

    _groups = itertools.count(1)

    def __init__(
        self,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"update-weight-buffer-size must be at least 1 byte, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self.timeout_s = timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.object_store = ObjectStoreWeightSync()
        self._session: _Session | None = None
        self._push_ids = itertools.count(1)
        self._last_push = 0

    def push(
        self, train: TrainGroup, receivers: Sequence[WeightReceiver], *, version: int, wait: bool = True
    ) -> list[ray.ObjectRef]:
        def direct(receiver: WeightReceiver) -> list[ray.ObjectRef] | None:
            hook = getattr(receiver, "collective_push", None)
            return None if hook is None else hook(version, functools.partial(self._push, train, version))

        refs = push_split(train, receivers, version, direct, self.object_store)
        if wait and refs:
            self._wait(train, refs)
        return refs

    def last_push_timings(self, train: TrainGroup, timeout_s: float = 5.0) -> dict[str, float] | None:
        """The last collective push as the trainer's rank 0 timed it (`WeightSender.timings`: the gather,
        the wait for the engines, the copies to the device, the broadcasts), once its send ended; None
        before any push, or after a failed one (its group is gone)."""
        if not self._last_push or self._session is None:
            return None
        import ray

        return ray.get(
            train.leader.weight_push_timings.remote(self._last_push, timeout_s), timeout=timeout_s + 60
        )

    def _push(
        self, train: TrainGroup, version: int, actors: Sequence[Any], expected: int
    ) -> list[ray.ObjectRef]:
        session, joins = self._session_for(train, actors)
        push_id = self._last_push = next(self._push_ids)
        plan = train.prepare_weight_push(push_id, self.bucket_bytes)
        order = PushOrder(
            session.name,
            push_id,
            tuple(tuple(bucket) for bucket in plan),
            version,
            expected,
            session.load_format,
            self.ready_timeout_s,
        )
        refs = [actor.weight_push_receive.remote(order) for actor in actors]
        train.send_weight_push(push_id, session.members, self.ready_timeout_s, session.load_format)
        session.last = [*joins, *refs]
        log.debug(
            "weight push %d (version %d): %d tensors, %.1f MB in %d bucket(s) to %d engine(s) over %s",
            push_id, version, order.tensors, order.nbytes / 1e6, len(plan), len(actors), session.name,
        )  # fmt: skip
        return session.last

    def _wait(self, train: TrainGroup, refs: list[ray.ObjectRef]) -> None:
        import ray

        try:
            ray.get(refs)
        except Exception as exc:
            reasons = _errors(refs)  # every receiver's, each once (and none left unretrieved)
            if self._session is not None:
                sender = train.weight_push_error(self._last_push, 5.0)
                if sender:
                    reasons.append(f"trainer {sender}")
                self._reset(train)
            raise WeightPushError(
                "collective weight sync failed:\n  " + "\n  ".join(reasons or [str(exc)])
            ) from exc

    def _session_for(self, train: TrainGroup, actors: Sequence[Any]) -> tuple[_Session, list[Any]]:
        """The group of this engine set, formed on first use (and again after the set changed or a push
        failed): returns it and the engines' join calls, to be awaited with the push."""
        import ray

        key = tuple(actor._actor_id.hex() for actor in actors)
        session = self._session
        if session is not None and session.key == key and not _failed(session.last):
            return session, []
        self._reset(train)
        infos = ray.get([actor.weight_group_info.remote() for actor in actors], timeout=self.ready_timeout_s)
        ranks = [max(1, int(info.get("ranks", 1))) for info in infos]
        formats = [set(info.get("load_formats") or [None]) for info in infos]
        load_format = FLATTENED if all(FLATTENED in f for f in formats) else None
        job = ray.get_runtime_context().get_job_id()
        name = f"relax-weights-{job}-{next(self._groups)}"
        host, port, backend = train.open_weight_group(name, self.timeout_s)
        world = 1 + sum(ranks)
        train.join_weight_group(world)
        indices = [info.get("engine_index", i) for i, info in enumerate(infos)]
        if len(set(indices)) != len(indices):
            indices = list(range(len(actors)))
        members = [f"engine{index}" for index in indices]
        joins, offset = [], 1
        for actor, count, member in zip(actors, ranks, members, strict=True):
            order = JoinOrder(host, port, offset, world, name, backend, self.timeout_s, member)
            joins.append(actor.weight_group_join.remote(order))
            offset += count
        self._session = _Session(key, name, members, load_format)
        log.info(
            "weight-update group %s: trainer rank 0 at %s:%d and %d engine(s), %d ranks, %s, %s payload",
            name, host, port, len(actors), world, backend, load_format or "per-tensor",
        )  # fmt: skip
        return self._session, joins

    def _reset(self, train: TrainGroup) -> None:
        session, self._session = self._session, None
        if session is not None:
            train.close_weight_group()


def _failed(refs: list[Any]) -> bool:
    """Whether any of a finished push's calls failed (calls still running count as not failed)."""
    if not refs:
        return False
    import ray

    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    for ref in done:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001
            return True
    return False


def _errors(refs: list[Any]) -> list[str]:
    """The distinct errors of finished calls, as their last line says them (Ray's wrap the actor's)."""
    import ray

    done, _ = ray.wait(refs, num_returns=len(refs), timeout=10)
    reasons: list[str] = []
    for ref in done:
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001
            cause = getattr(exc, "cause", None) or exc
            line = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
            if line not in reasons:
                reasons.append(line)
    return reasons
