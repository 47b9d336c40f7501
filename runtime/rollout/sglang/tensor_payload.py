"""Named tensors on the wire (`/update_weights_from_tensor`) and on disk (`/update_weights_from_disk`).

SGLang's `serialized_named_tensors` entries are base64 of `ForkingPickler` bytes (its
`MultiprocessingSerializer`): tensors travel as CUDA-IPC / shared-memory handles, valid only on the same
host while the sender keeps them alive, and the receiver unpickles whatever it is sent. The built-in
engine takes a self-contained, code-free payload instead: each entry is base64 of safetensors bytes,
flagged by `load_format = RELAX_SAFETENSORS_FORMAT`. Same field names, same request shape, one entry per
TP rank; only the bytes inside differ. `SGLangIpcCodec` produces SGLang's own format for a real server.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import load_file as safetensors_load_file
from safetensors.torch import save as safetensors_save

RELAX_SAFETENSORS_FORMAT = "relax_safetensors"  # load_format of our payload; SGLang does not know it


class TensorCodec(Protocol):
    """Turns named tensors into `serialized_named_tensors` (one entry per TP rank) plus its load_format."""

    load_format: str | None

    def encode(self, named_tensors: Sequence[tuple[str, torch.Tensor]], tp_size: int) -> list[str]: ...


class SafetensorsCodec:
    """Our payload: base64(safetensors bytes of CPU copies). Works across processes and hosts; costs one
    copy and ~1.33x bytes on the wire, so it suits CPU pools and small models (big models: disk/NCCL)."""

    load_format: str | None = RELAX_SAFETENSORS_FORMAT

    def encode(self, named_tensors: Sequence[tuple[str, torch.Tensor]], tp_size: int) -> list[str]:
        payload = encode_named_tensors(named_tensors)
        return [payload] * tp_size  # every rank gets the full set, as SGLang's callers send it


class SGLangIpcCodec:
    """SGLang's own payload (`MultiprocessingSerializer.serialize(..., output_str=True)`), for a real
    SGLang server on the same host. Needs sglang importable in the sending process."""

    load_format: str | None = None

    def encode(self, named_tensors: Sequence[tuple[str, torch.Tensor]], tp_size: int) -> list[str]:
        try:
            from sglang.srt.utils import MultiprocessingSerializer  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - sglang is never installed on CPU machines
            raise RuntimeError(
                "sending tensors to a real SGLang server needs sglang in this process "
                "(MultiprocessingSerializer); use update_weights_from_disk otherwise"
            ) from exc
        payload = MultiprocessingSerializer.serialize(list(named_tensors), output_str=True)
        return [payload] * tp_size


def encode_named_tensors(
    named_tensors: Sequence[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
) -> str:
    """base64 of safetensors bytes. Tensors sharing storage (tied embeddings) are copied apart, since
    safetensors refuses shared memory."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    seen: set[int] = set()
    flat: dict[str, torch.Tensor] = {}
    for name, tensor in items:
        cpu = tensor.detach().to("cpu").contiguous()
        storage = cpu.untyped_storage().data_ptr()
        if storage in seen:  # tied weights, or slices of one fused buffer
            cpu = cpu.clone()
        seen.add(cpu.untyped_storage().data_ptr())
        flat[name] = cpu
    return base64.b64encode(safetensors_save(flat)).decode("ascii")


def decode_named_tensors(payload: str) -> dict[str, torch.Tensor]:
    try:
        raw = base64.b64decode(payload, validate=True)
    except ValueError as exc:
        raise ValueError(f"serialized_named_tensors entry is not base64: {exc}") from None
    return safetensors_load(raw)


def bucket_named_tensors(
    named_tensors: Mapping[str, torch.Tensor], max_bytes: int | None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most `max_bytes` (a tensor larger than that travels alone); None: one group."""
    items = list(named_tensors.items())
    if max_bytes is None:
        yield items
        return
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def read_hf_weights(model_path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of a Hugging Face folder: `*.safetensors` (sharded or not), else `pytorch_model*.bin`
    (loaded with weights_only). A single `.safetensors` file is accepted too."""
    path = Path(model_path)
    if path.is_file() and path.suffix == ".safetensors":
        return safetensors_load_file(str(path))
    if not path.is_dir():
        raise FileNotFoundError(f"no model folder at {path}")
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        shards = [path / f for f in files]
    else:
        shards = sorted(path.glob("*.safetensors"))
    weights: dict[str, torch.Tensor] = {}
    if shards:
        for shard in shards:
            weights.update(safetensors_load_file(str(shard)))
        return weights
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{path} has no *.safetensors or pytorch_model*.bin weights")
    for shard in bins:
        weights.update(torch.load(shard, map_location="cpu", weights_only=True))
    return weights
