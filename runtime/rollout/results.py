"""Per-sample rollout records: `<save>/rollout_result/train/<rollout_id>.jsonl` and
`<save>/rollout_result/eval/<rollout_id>.jsonl` (every eval set in one file, each record naming its
`dataset`), one line per sample, as Relax writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.types import Sample

ROLLOUT_RESULT_DIR = "rollout_result"


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    return path


def write_train_result(save_dir: str | Path, rollout_id: int, samples: list[Sample]) -> Path:
    path = Path(save_dir) / ROLLOUT_RESULT_DIR / "train" / f"{rollout_id}.jsonl"
    return _write(path, [{"rollout_id": rollout_id, **s.to_record()} for s in samples])


def write_eval_result(save_dir: str | Path, rollout_id: int, datasets: dict[str, list[Sample]]) -> Path:
    path = Path(save_dir) / ROLLOUT_RESULT_DIR / "eval" / f"{rollout_id}.jsonl"
    records = [
        {"rollout_id": rollout_id, "dataset": name, **s.to_record()}
        for name, samples in datasets.items()
        for s in samples
    ]
    return _write(path, records)
