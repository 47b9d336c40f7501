"""Which weight sync a job uses, from its layout (the driver's one call: `weight_sync_for`).

- engines hosted in the trainer's ranks: `in_place` (always);
- `$RELAX_WEIGHT_SYNC` (`object_store` | `nccl`), where set in the driver's environment, otherwise;
- engines that take turns with the trainer on its devices (colocated): `object_store` (NCCL cannot put two
  ranks of one group on one GPU; CUDA IPC is the way for those, not done yet);
- external engines (`--rollout-external-engine-addrs`): `object_store` (their servers may not reach the
  trainer's node);
- the job's own engines on GPUs of their own: `nccl` (`runtime.weight_sync.collective`, in buckets of
  `--update-weight-buffer-size` bytes);
- on CPU: `object_store` (`RELAX_WEIGHT_SYNC=nccl` runs the collective over gloo).

Receivers the collective cannot reach (forward-only roles, engines a supervisor or an autoscaler may
replace) still go through the object store inside it (`CollectiveWeightSync.push`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runtime.devices import Device, DeviceKind
from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend
from runtime.weight_sync.collective import DEFAULT_BUCKET_BYTES, CollectiveWeightSync

if TYPE_CHECKING:
    from runtime.roles.groups import Roles

log = logging.getLogger(__name__)

WEIGHT_SYNC_ENV = "RELAX_WEIGHT_SYNC"


def requested_backend(value: str | None = None) -> WeightSyncBackend | None:
    """`$RELAX_WEIGHT_SYNC` (or `value`) as a backend; None when unset. `in_place` is not asked for: it is
    what engines in the trainer's ranks get."""
    raw = (os.environ.get(WEIGHT_SYNC_ENV, "") if value is None else value).strip().lower()
    if not raw:
        return None
    choices = [b for b in WeightSyncBackend if b is not WeightSyncBackend.IN_PLACE]
    try:
        backend = WeightSyncBackend(raw)
    except ValueError:
        backend = None
    if backend not in choices:
        raise ValueError(f"{WEIGHT_SYNC_ENV}={raw!r}: use one of {', '.join(b.value for b in choices)}")
    return backend


def choose_backend(
    *,
    engines_in_trainer: bool,
    takes_turns: bool,
    external_engines: bool,
    device: Device,
    requested: WeightSyncBackend | None = None,
) -> tuple[WeightSyncBackend, str]:
    """(the backend, why), as the module docstring orders the rules."""
    if engines_in_trainer:
        return WeightSyncBackend.IN_PLACE, "the engines live in the trainer's ranks"
    if requested is not None:
        return requested, f"{WEIGHT_SYNC_ENV}={requested.value}"
    if takes_turns:
        return WeightSyncBackend.OBJECT_STORE, "the engines take turns with the trainer on its devices"
    if external_engines:
        return WeightSyncBackend.OBJECT_STORE, "external engines may not reach the trainer's node"
    if device.kind is DeviceKind.CUDA:
        return WeightSyncBackend.COLLECTIVE, "the job's own engines on GPUs of their own"
    return (
        WeightSyncBackend.OBJECT_STORE,
        f"on CPU (set {WEIGHT_SYNC_ENV}=nccl for the collective, over gloo)",
    )


def weight_sync_for(roles: Roles, device: Device, values: Mapping[str, Any]) -> WeightSync:
    """The job's weight sync (`values`: the spec's, for `update_weight_buffer_size`)."""
    external = any(info.get("external") for info in roles.infos)
    backend, why = choose_backend(
        engines_in_trainer=roles.engines_in_trainer,
        takes_turns=roles.takes_turns,
        external_engines=external,
        device=device,
        requested=requested_backend(),
    )
    log.info("weight sync: %s (%s)", backend.value, why)
    if backend is WeightSyncBackend.COLLECTIVE:
        size = values.get("update_weight_buffer_size") or DEFAULT_BUCKET_BYTES
        return CollectiveWeightSync(bucket_bytes=int(size))
    return WEIGHT_SYNC_BACKENDS.get(backend)()
