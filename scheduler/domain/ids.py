"""Prefixed, time-sortable identifiers (job_…, key_…): the prefix tells what an id names."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    # 12 hex digits of milliseconds keep ids sortable by creation, which cursor pages rely on;
    # 8 random hex digits keep ids made in the same millisecond apart.
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(4)}"
