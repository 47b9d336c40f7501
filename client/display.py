"""How `relaxctl` shows what the API returns: tables that fit the terminal without cutting an id or a name,
slots named for what they are (GPU or CPU), and steps numbered as the driver's log numbers them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

# ---- steps ---------------------------------------------------------------------------------------------------
#: Metrics measured after a step (evaluations) rather than during one: runtime/driver.py reports them under the
#: number of steps done (0: before the first step), which is already the log's numbering.
EVAL_PREFIX = "eval/"


def log_step(name: str, step: int) -> int:
    """A stored metric step in the numbering of the driver's log (`step 1/300` … `step 300/300`).

    The driver stores a step's own metrics (rollout/…, train/…, perf/…) under the step's index from 0
    (runtime/pipeline/base.py `PipelineBase.finish_step`: `reporter.metrics(rollout_id, …)` then logs
    `rollout_id + 1`), and an evaluation under the number of steps done (runtime/driver.py:
    `reporter.metrics(rollout_id + 1, eval…)`).
    The API keeps what the driver sent; only what relaxctl prints is converted."""
    return step if name.startswith(EVAL_PREFIX) else step + 1


#: Driver events whose reason begins `step <index from 0>:` (runtime/saving.py, runtime/pipeline/rl.py and
#: runtime/pipeline/sft.py): the checkpoint, export or predictions of that step, whose folder keeps the index
#: (`iter_0000002` is the third step's, `step 3/300` in the log).
STEP_EVENTS = frozenset({"checkpoint_saved", "hf_exported", "predictions_written"})
_STEP_REASON = re.compile(r"^((?:critic )?step )(\d+):")


def event_reason(kind: str, reason: str | None, total: int | None = None) -> str:
    """An event's reason as relaxctl prints it: a step event's step in the log's numbering
    (`step 2: …/iter_0000002` -> `step 3/6: …/iter_0000002`); any other reason as it is."""
    text = reason or ""
    m = _STEP_REASON.match(text) if kind in STEP_EVENTS else None
    if m is None:
        return text
    step = int(m.group(2)) + 1
    return (
        f"{m.group(1)}{step}/{total}:" + text[m.end() :]
        if total
        else f"{m.group(1)}{step}:" + text[m.end() :]
    )


# ---- slots ---------------------------------------------------------------------------------------------------
def slot_kind(accelerator: str | None) -> str | None:
    """ "CPU" for a pool whose slots are CPU slots (the embedded platform on a machine without GPUs registers its
    pool with accelerator `cpu`, api/embedded.py `detect_slots`), "GPU" for any other accelerator (h200, a100,
    gpu, ...), None where the pool is not known."""
    if not accelerator:
        return None
    return "CPU" if accelerator.strip().lower() == "cpu" else "GPU"


def slots(count: int | str, kind: str | None) -> str:
    """`2 CPU`, `8 GPU`, or a bare `2` where the kind is not known."""
    return f"{count} {kind}" if kind else str(count)


def slots_phrase(count: int, kind: str | None) -> str:
    """`1 GPU`, `2 GPUs`, `2 CPU slots`, `1 slot`: for sentences."""
    noun = {"GPU": "GPU", "CPU": "CPU slot"}.get(kind or "", "slot")
    return f"{count} {noun}{'' if count == 1 else 's'}"


def pool_kinds(pools: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Pool name -> its slot kind, from `GET /v1/pools`."""
    return {p["name"]: slot_kind(p.get("accelerator")) for p in pools}


# ---- tables --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Col:
    """A table column. `drop`: 0 for a column always shown (ids, names, what the command is about); else the
    order in which columns give way when the terminal is too narrow, highest first. `wrap`: prose (reasons,
    lists), which wraps in whatever width is left instead of being dropped first. Nothing is ever cut short
    with an ellipsis: an id or a name too long for even the narrowest layout folds onto the next line."""

    header: str
    drop: int = 0
    wrap: bool = False
    right: bool = False


#: The narrowest a prose column gets before it is dropped instead.
WRAP_MIN = 24
#: Between two columns.
GAP = 2


def _natural(col: Col, values: Sequence[str]) -> int:
    return max([len(col.header), *(len(v) for v in values)])


def _need(cols: Sequence[Col], columns: Sequence[Sequence[str]]) -> int:
    widths = [
        min(_natural(c, v), max(WRAP_MIN, len(c.header))) if c.wrap else _natural(c, v)
        for c, v in zip(cols, columns, strict=True)
    ]
    return sum(widths) + GAP * (len(widths) - 1)


def fit(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int, wide: bool) -> list[int]:
    """The indexes of the columns shown: every one with `wide`, else those that fit `width`, dropping the
    droppable ones (highest `drop` first) until the rest fits."""
    shown = list(range(len(cols)))
    if wide:
        return shown
    columns = [[str(r[i]) for r in rows] for i in range(len(cols))]
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop):
        if _need([cols[j] for j in shown], [columns[j] for j in shown]) <= width:
            break
        shown.remove(i)
    return shown


def _fixed_widths(
    cols: Sequence[Col], rows: Sequence[Sequence[str]], shown: list[int], width: int | None
) -> dict[int, int]:
    """The widths of the shown columns that are not prose: each its widest cell, then, while the table is
    wider than `width`, the widest of them narrowed down to the next widest, and so on."""
    widths = {i: _natural(cols[i], [str(r[i]) for r in rows]) for i in shown if not cols[i].wrap}
    if width is None or not widths:
        return widths
    prose = sum(
        min(_natural(cols[i], [str(r[i]) for r in rows]), max(WRAP_MIN, len(cols[i].header)))
        for i in shown
        if cols[i].wrap
    )
    excess = sum(widths.values()) + prose + GAP * (len(shown) - 1) - width
    while excess > 0:
        top = max(widths.values())
        if top <= 1:
            break
        tops = [i for i, w in widths.items() if w == top]
        below = max((w for w in widths.values() if w < top), default=1)
        step = max(1, min(top - below, -(-excess // len(tops))))
        for i in tops:
            widths[i] = top - step
        excess -= step * len(tops)
    return widths


def print_table(
    console: Console,
    cols: Sequence[Col],
    rows: Sequence[Sequence[str]],
    *,
    wide: bool = False,
    note: Console | None = None,
) -> None:
    """Print rows under their headers in the console's width (see `fit`); with `note`, say there which columns
    were left out and that `--wide` shows them."""
    shown = fit(cols, rows, console.width, wide)
    table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), header_style="bold", show_edge=False)
    widths = _fixed_widths(cols, rows, shown, None if wide else console.width)
    for i in shown:
        c = cols[i]
        # A column that is not prose is as wide as its widest cell, so it never wraps; prose takes what is
        # left. Where the columns left are still wider than the terminal, the widest are narrowed first (a
        # long name before an id) and their cells fold onto the next line (no_wrap would crop them).
        table.add_column(
            c.header, overflow="fold", justify="right" if c.right else "left", width=widths.get(i)
        )
    for r in rows:
        table.add_row(*(Text(str(r[i])) for i in shown))
    if wide:  # as wide as the rows need, past the terminal's edge if need be (the terminal wraps the lines)
        natural = [_natural(cols[i], [str(r[i]) for r in rows]) for i in shown]
        width = max(console.width, sum(natural) + GAP * (len(natural) - 1))
        Console(
            file=console.file,
            width=width,
            color_system=console.color_system,  # type: ignore[arg-type]
            force_terminal=console.is_terminal,
            no_color=console.no_color,
        ).print(table)
    else:
        console.print(table)
    hidden = [cols[i].header for i in range(len(cols)) if i not in shown]
    if hidden and note is not None:
        note.print(
            f"[dim]not shown at {console.width} columns: {', '.join(hidden)} (--wide shows every column, "
            "--json everything)[/dim]",
            highlight=False,
        )


def short_time(iso: str | None) -> str:
    """`2026-12-05T07:12:18.123Z` -> `12-05 07:12` (UTC, as the API gives it); `-` for none."""
    return iso[5:16].replace("T", " ") if iso else "-"


def full_time(iso: str | None) -> str:
    """`2026-12-05T07:12:18.123Z` -> `2026-12-05 07:12:18`; `-` for none."""
    return iso[:19].replace("T", " ") if iso else "-"
