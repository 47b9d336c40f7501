"""JSON text of the database's JSON columns."""

from __future__ import annotations

from typing import Any

import pydantic_core


def json_dumps(value: Any) -> str:
    """JSON columns' text: what `json.dumps` writes (NaN and Infinity as it writes them), compact and without
    escaping non-ASCII characters, in pydantic-core's encoder (a job's spec, ~30 kB: 0.14 ms instead of
    0.37 ms)."""
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


def json_loads(text: str | bytes) -> Any:
    """JSON columns' values, read by pydantic-core's parser (what `json.loads` gives, in a third of the time)."""
    return pydantic_core.from_json(text)
