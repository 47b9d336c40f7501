"""Megatron checkpoints in Relax's layout: `<save>/iter_NNNNNNN/` written with megatron-core's
`dist_checkpointing` (`--ckpt-format torch_dist`), plus `latest_checkpointed_iteration.txt`.

Inside `iter_NNNNNNN/`: the distributed checkpoint (`*.distcp`, `.metadata`, `common.pt`, `metadata.json`)
holding the policy (`model.*`; `model{i}.*` per virtual-pipeline chunk), the optimizer (unless
`--no-save-optim`), each rank's RNG states and, when `ref-update-interval` moves the reference model, the
reference (`ref_model.*`); `trainer_state.json` (layout, iteration, optimizer steps, the driver's extra
state, what the checkpoint holds); the `.relax-job` owner mark.

Every function here is a collective: all ranks call it with the same arguments. Rank 0 owns the folder
(`atomic_directory`: written under a scratch name, renamed into place once every rank has written its
part, never replacing a folder another job wrote).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.access import LOCAL_OWNER
from runtime.train.checkpoint import (
    CheckpointFormat,
    CheckpointRecord,
    atomic_directory,
    iteration_dir,
    latest_complete_iteration,
    read_latest_iteration,
    record,
    write_latest_iteration,
)

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CHECKPOINT_LAYOUT = "relax-megatron/1"
CKPT_FORMAT = "torch_dist"
# the distributed optimizer's state layout in the checkpoint (Megatron-LM's default for torch_dist; it can be
# resharded across data-parallel sizes)
OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}
REFERENCE_PREFIX = "ref_model."


def chunk_key(index: int, chunks: int) -> str:
    """Megatron-LM's key of a model chunk: `model`, or `model0`, `model1`, ... with virtual pipelining."""
    return "model" if chunks == 1 else f"model{index}"


# -- pieces of the sharded state dict ------------------------------------------------------------------------


def model_sharded_state(models: list, prefix: str = "") -> dict[str, Any]:
    return {chunk_key(i, len(models)): m.sharded_state_dict(prefix=prefix) for i, m in enumerate(models)}


def _rng_states() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(states["torch"])
    if torch.cuda.is_available() and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(states["tracker"])


def rng_sharded_object(states: dict[str, Any] | None = None) -> Any:
    """This rank's RNG states, one object per (pipeline, tensor) rank, as Megatron-LM keeps them (the
    data-parallel and context-parallel ranks of one (pipeline, tensor) rank are its replicas)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject(
        "rng_state",
        _rng_states() if states is None else states,
        (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()),
        (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def _distributed_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def prepare_optimizer_for_load(optimizer: Any) -> None:
    """A fresh distributed optimizer has no state yet; megatron-core fills it with placeholders (one Adam
    step on zero gradients) before a checkpoint can be loaded into it. Call before building the sharded
    state dict; the model's weights must be loaded afterwards."""
    for inner in _distributed_optimizers(optimizer):
        if hasattr(inner, "_init_optimizer_states_with_dummy_values") and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


def load_optimizer_state(optimizer: Any, state: dict[str, Any]) -> None:
    # fp32 parameters: the distributed optimizer's main params are views of the model's leaf parameters,
    # which an in-place copy under autograd refuses
    with torch.no_grad():
        optimizer.load_state_dict(state)
    # megatron-core 0.16 restores torch Adam's per-parameter `step` from the placeholder state, not from the
    # checkpoint (it keeps the saved value in each param group's "step"): put the saved value back, or the
    # bias correction after a resume would differ from an uninterrupted run
    for inner in _distributed_optimizers(optimizer):
        torch_opt = getattr(inner, "optimizer", None)
        if torch_opt is None:
            continue
        for group in torch_opt.param_groups:
            if "step" not in group:
                continue
            for param in group["params"]:
                param_state = torch_opt.state.get(param)
                if param_state and "step" in param_state:
                    param_state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


# -- writing -------------------------------------------------------------------------------------------------


def _shared_scratch(stack: contextlib.ExitStack, final: Path, owner: str) -> Path:
    """Rank 0 opens `atomic_directory(final)` on `stack` and every rank learns its scratch folder."""
    holder: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            holder[0] = str(stack.enter_context(atomic_directory(final, owner=owner)))
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they would wait forever
            holder[0] = exc
    dist.broadcast_object_list(holder, src=0)
    if isinstance(holder[0], Exception):
        raise holder[0]
    return Path(holder[0])


def _all_ok(ok: bool) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@dataclass
class PendingSave:
    """An `async-save` in flight: the files are written by a thread; `finish()` (a collective) completes it."""

    iteration: int
    save_dir: str
    final: Path
    scratch: Path
    stack: contextlib.ExitStack
    finalize: list[Callable[[], None]]
    state: dict[str, Any]
    state_file: str = STATE_FILE
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    started: float = field(default_factory=time.perf_counter)


def _write_state(scratch: Path, state: dict[str, Any], state_file: str = STATE_FILE) -> None:
    (scratch / state_file).write_text(json.dumps(state, indent=2) + "\n")


def save(
    save_dir: str,
    iteration: int,
    sharded_state: dict[str, Any],
    state: dict[str, Any],
    *,
    owner: str = LOCAL_OWNER,
    blocking: bool = True,
    state_file: str = STATE_FILE,
) -> CheckpointRecord | PendingSave | None:
    """Write `sharded_state` as `<save_dir>/iter_NNNNNNN/` (a collective). Blocking: returns the record on
    rank 0 (None elsewhere) once the folder is in place and `latest_checkpointed_iteration.txt` points at it.
    `blocking=False`: the tensors are staged (copied) now, the files are written by a thread, and the
    returned `PendingSave` is completed by `finish()`. `state` is written as `state_file` (`trainer_state.json`;
    PPO's critic writes its own name)."""
    from megatron.core import dist_checkpointing

    final = iteration_dir(save_dir, iteration)
    if dist.get_rank() == 0:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
    stack = contextlib.ExitStack()
    scratch = _shared_scratch(stack, final, owner)
    started = time.perf_counter()
    try:
        request = dist_checkpointing.save(
            sharded_state,
            str(scratch),
            sharded_strategy=(CKPT_FORMAT, 1),
            async_sharded_save=not blocking,
            **_async_strategy(blocking),
        )
        if request is not None:
            args = list(request.async_fn_args)
            if request.preload_fn is not None:
                args[1] = _private_copy(request.preload_fn())
    except BaseException as exc:
        stack.__exit__(type(exc), exc, exc.__traceback__)
        raise
    if blocking:
        return _commit(
            stack, scratch, save_dir, iteration, final, state, started, ok=True, state_file=state_file
        )
    pending = PendingSave(
        iteration,
        save_dir,
        final,
        scratch,
        stack,
        list(request.finalize_fns),  # type: ignore[union-attr]
        state,
        state_file,
    )

    def write() -> None:
        try:
            if request.async_fn is not None:  # type: ignore[union-attr]
                request.async_fn(*args, **request.async_fn_kwargs)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            pending.error = exc
        finally:
            pending.done.set()

    threading.Thread(target=write, name=f"checkpoint-writer-{iteration}", daemon=True).start()
    return pending


def _async_strategy(blocking: bool) -> dict[str, Any]:
    """megatron-core >= 0.19 picks an async writer (`async_strategy`, default "nvrx": nvidia-resiliency-ext,
    not installed); ours runs the write itself, so ask for megatron-core's own ("mcore")."""
    import inspect

    from megatron.core import dist_checkpointing

    if blocking or "async_strategy" not in inspect.signature(dist_checkpointing.save).parameters:
        return {}
    return {"async_strategy": "mcore"}


def _private_copy(write_buckets: list[Any]) -> list[Any]:
    """On CPU, staging (`tensor.to("cpu")`) returns the live tensors themselves: copy them, so training can
    go on while the thread writes. (On CUDA the staging already made host copies.)"""
    if torch.cuda.is_available():
        return write_buckets
    copied = []
    for file_name, storage_key, (bytes_data, tensor_data) in write_buckets:
        copied.append(
            (file_name, storage_key, (bytes_data, [(item, t.detach().clone()) for item, t in tensor_data]))
        )
    return copied


def finish(pending: PendingSave, *, wait: bool) -> CheckpointRecord | None | bool:
    """Complete an async save once every rank has written its files (a collective: all ranks call it with
    the same `wait`). Returns False when some rank is still writing (and `wait` is False), else the record on
    rank 0 (None elsewhere). A failed write on any rank raises on every rank."""
    if wait:
        pending.done.wait()
    if not _all_ok(pending.done.is_set()):
        return False
    ok = _all_ok(pending.error is None)
    if ok:
        for fn in pending.finalize:
            fn()
    return _commit(
        pending.stack,
        pending.scratch,
        pending.save_dir,
        pending.iteration,
        pending.final,
        pending.state,
        pending.started,
        ok=ok,
        error=pending.error,
        state_file=pending.state_file,
    )


def _commit(
    stack: contextlib.ExitStack,
    scratch: Path,
    save_dir: str,
    iteration: int,
    final: Path,
    state: dict[str, Any],
    started: float,
    *,
    ok: bool,
    error: BaseException | None = None,
    state_file: str = STATE_FILE,
) -> CheckpointRecord | None:
    """Every rank has written its part (or some failed): rank 0 renames the folder into place and points
    `latest_checkpointed_iteration.txt` at it, or drops the scratch folder."""
    ok = _all_ok(ok)
    result: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            if not ok:
                failure = error or RuntimeError(f"a rank failed to write checkpoint iteration {iteration}")
                stack.__exit__(type(failure), failure, failure.__traceback__)
                result[0] = failure
            else:
                _write_state(scratch, state, state_file)
                stack.close()  # atomic_directory: owner mark, owner check, rename
                write_latest_iteration(save_dir, iteration)
                result[0] = record(final, iteration, CheckpointFormat.TORCH)
                log.info("wrote %s in %.2fs", final, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it
            result[0] = exc
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], BaseException):
        if not ok and error is not None:
            raise error
        raise result[0] if isinstance(result[0], Exception) else RuntimeError(str(result[0]))
    return result[0] if dist.get_rank() == 0 else None


# -- reading -------------------------------------------------------------------------------------------------


def latest(
    load_dir: str | Path, *, state_file: str = STATE_FILE, layout: str = CHECKPOINT_LAYOUT
) -> tuple[int, Path, dict[str, Any]] | None:
    """(iteration, folder, state) of the latest checkpoint under `load_dir`, or None; its `state_file` must
    name `layout` (when it names one)."""
    iteration = latest_complete_iteration(load_dir, state_file=state_file)
    if iteration is None:
        return None
    folder = iteration_dir(load_dir, iteration)
    path = folder / state_file
    state = json.loads(path.read_text()) if path.is_file() else {}
    found = state.get("layout")
    if found is not None and found != layout:
        raise ValueError(
            f"{folder} is a {found!r} checkpoint, not a Megatron one ({layout}): it was written by "
            "another train backend"
        )
    return iteration, folder, state


def is_checkpoint_root(path: str | Path) -> bool:
    return read_latest_iteration(path) is not None


def load(folder: Path, sharded_state: dict[str, Any]) -> dict[str, Any]:
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(sharded_state, str(folder))
