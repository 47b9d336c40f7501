"""Which model code a rollout engine server runs: fastgen (runtime/rollout/fastgen: continuous batching,
static KV cache, CUDA-graph decode) or Hugging Face `generate` (runtime/rollout/engine.py).

Chosen by `RELAX_ROLLOUT_BACKEND` (`auto` | `fastgen` | `hf`; default `auto`) in the environment of the
process that starts the SGLang-protocol server (the engine actor's, which the server inherits), or by the
server's own `--relax-engine` flag, which wins. The in-process rollout actor (`RELAX_ROLLOUT_ENGINE=in-process`)
runs fastgen only when `RELAX_ROLLOUT_BACKEND=fastgen` says so (`in_process_engine`). `auto` is fastgen when CUDA is present and fastgen
implements the checkpoint's architecture (`ModelConfig.from_hf` accepts its config.json), else HF: on CPU
HF is the reference and fastgen gains nothing, and an architecture fastgen lacks must still run.

This is orthogonal to `RELAX_ROLLOUT_ENGINE` (runtime/roles/groups.py: `http` = an engine server driven
over SGLang's protocol, `in-process` = `TorchRolloutEngine` inside the rollout actor), which says where the
engine runs, not which code generates.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

BACKEND_ENV = "RELAX_ROLLOUT_BACKEND"


class RolloutBackend(StrEnum):
    AUTO = "auto"  # fastgen on CUDA for an architecture it implements, else hf
    FASTGEN = "fastgen"  # runtime/rollout/fastgen, through runtime/rollout/sglang/fastgen_serving.py
    HF = "hf"  # Hugging Face generate, through runtime/rollout/sglang/serving.py


def backend_from_env(value: str | None = None) -> RolloutBackend:
    """`value` (or `$RELAX_ROLLOUT_BACKEND`) as a backend; empty means auto; anything else is refused."""
    raw = (os.environ.get(BACKEND_ENV, "") if value is None else value).strip().lower()
    try:
        return RolloutBackend(raw) if raw else RolloutBackend.AUTO
    except ValueError:
        raise ValueError(
            f"{BACKEND_ENV}={raw!r}: use one of {', '.join(b.value for b in RolloutBackend)}"
        ) from None


def fastgen_unsupported(model_path: str | Path) -> str | None:
    """Why fastgen cannot run this checkpoint (None: it can)."""
    from runtime.rollout.fastgen.model import ModelConfig

    config_file = Path(model_path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read {config_file}: {exc}"
    try:
        ModelConfig.from_hf(config)
    except (ValueError, KeyError) as exc:
        return str(exc)
    if not any(Path(model_path).glob("*.safetensors")):
        return f"no *.safetensors in {model_path} (fastgen reads safetensors only)"
    return None


def resolve_backend(requested: RolloutBackend, model_path: str | Path, *, cuda: bool) -> RolloutBackend:
    """The concrete backend (never AUTO). An explicit `fastgen` for a checkpoint fastgen cannot run is an
    error naming why; `auto` falls back to `hf` then."""
    if requested is RolloutBackend.HF:
        return RolloutBackend.HF
    reason = fastgen_unsupported(model_path)
    if requested is RolloutBackend.FASTGEN:
        if reason is not None:
            raise ValueError(f"{BACKEND_ENV}=fastgen: {reason}")
        return RolloutBackend.FASTGEN
    return RolloutBackend.FASTGEN if cuda and reason is None else RolloutBackend.HF


def in_process_engine(hf_checkpoint: str, *, device: Any, max_batch_size: int = 256) -> Any:
    """The rollout actor's own engine (`RELAX_ROLLOUT_ENGINE=in-process`): `FastGenEngine` when
    `RELAX_ROLLOUT_BACKEND=fastgen` names it, else `TorchRolloutEngine`. Here `auto` keeps HF: the
    in-process engine's fp32 HF numerics are what the trainer-agreement checks of that mode pin, and the
    HTTP servers are where fastgen is the default."""
    if backend_from_env() is RolloutBackend.FASTGEN:
        resolve_backend(RolloutBackend.FASTGEN, hf_checkpoint, cuda=True)  # refuses what fastgen cannot run
        from runtime.rollout.fastgen import FastGenEngine

        return FastGenEngine(hf_checkpoint, device=device, max_batch_size=max_batch_size)
    from runtime.rollout.engine import TorchRolloutEngine

    return TorchRolloutEngine(hf_checkpoint, device=device, max_batch_size=max_batch_size)


def load_versioned_weights(engine: Any, named_tensors: Mapping[str, Any], version: int) -> None:
    """Load a full state dict and record the driver's version. The driver's versions may skip
    (`update-weights-interval`, a resume) or repeat (SFT's re-push); fastgen's `load_weights` checks names
    and shapes against its own count (exactly the next), so it is called with that and then takes the
    driver's number."""
    from runtime.rollout.fastgen import FastGenEngine

    if isinstance(engine, FastGenEngine):
        engine.load_weights(named_tensors, engine.weight_version + 1)
        engine.weight_version = version
    else:
        engine.load_weights(named_tensors, version)
