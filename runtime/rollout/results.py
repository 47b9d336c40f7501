"""Writes rollout samples to `<save>/rollout_result/{train,eval}/<rollout_id>.jsonl`, one line per sample."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.types import Sample


def write_rollout_result(
    save_dir: str | Path, split: str, rollout_id: int, samples: list[Sample], *, name: str | None = None
) -> Path:
    """`name` separates several eval sets of one rollout (`<rollout_id>_<name>.jsonl`)."""
    folder = Path(save_dir) / "rollout_result" / split
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{rollout_id}_{name}.jsonl" if name else f"{rollout_id}.jsonl")
    with path.open("w", encoding="utf-8") as fh:
        for sample in samples:
            fh.write(json.dumps(sample.to_record(), ensure_ascii=False, default=str) + "\n")
    return path
