"""Generate docs/reference/parameters.md from the model: `python -m jobspec.docs > docs/reference/parameters.md`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from jobspec.arguments import FIELD_DEVIATIONS, RELAX_MAIN, SOURCES
from jobspec.generated.arguments import RELAX_MEGATRON_DEFAULTS
from jobspec.rules import INPUT_RULES, RETIRED_RULES, RULES, deviations
from jobspec.spec import FIELDS, GROUPS, FieldSpec

RELAX_DEFAULTS = RELAX_MEGATRON_DEFAULTS[RELAX_MAIN]

__all__ = ["MATHS_DEVIATIONS", "MathsDeviation", "render_parameters_md"]


@dataclass(frozen=True)
class MathsDeviation:
    """Where the runtime's RL maths (runtime/algos) deliberately give other numbers than Relax's code, because
    Relax's code has a bug there. Listed in the Notes of the flag it touches and in the deviations section;
    each example is pinned by a test in tests/unit/runtime/algos."""

    field: str  # the spec field (FIELDS key) whose row carries the note
    what: str  # what Relax's code does, and what the platform does instead
    example: str  # one line, with numbers


#: Everywhere else the maths give Relax's numbers (issue 17: compared with Relax's own functions).
MATHS_DEVIATIONS: tuple[MathsDeviation, ...] = (
    MathsDeviation(
        "eps_clip_c",
        "Relax's code accepts --eps-clip-c and never passes it to its PPO loss; the platform applies the dual "
        "clip the flag describes, min(loss, -A * eps_clip_c) where A < 0.",
        "A = -1, ratio 5, --eps-clip 0.2, --eps-clip-c 3: token loss 3 here, max(5, 1.2) = 5 in Relax.",
    ),
    MathsDeviation(
        "disable_grpo_std_normalization",
        "Relax normalises a group's rewards in float32, so a group of identical non-binary rewards keeps a "
        "rounding residue that the division by its ~0 std (+ 1e-6) blows up; the platform centres in "
        "float64 and gives 0.",
        "eight samples of one prompt, all rewarded 0.9: advantage 0 here, about -0.06 each in Relax.",
    ),
    MathsDeviation(
        "n_samples_per_prompt",
        "Relax's reference commit (eb15c45) normalises a batch whose size is not rollout_batch_size * "
        "n_samples_per_prompt as one group (main fixed it); the platform always groups by prompt.",
        "--n-samples-per-prompt 4, 6 samples rewarded 1, 0, 0, 0 | 1, 1: 1.5, -0.5, -0.5, -0.5 | 0, 0 "
        "here, +-0.91 (one group of 6) at the reference commit.",
    ),
    MathsDeviation(
        "use_opsm",
        "Relax's opsm_clipfrac divides a masked sample's dropped response tokens, trained or not, by its "
        "trained tokens; the platform counts trained tokens only (the share of them OPSM drops).",
        "a dropped sample of 4 response tokens, 2 of them trained (tool output between): 1 here, 4 / 2 = 2 "
        "in Relax.",
    ),
)
_MATHS_NOTES = {d.field: d for d in MATHS_DEVIATIONS}


def _default(f: FieldSpec) -> str:
    value: Any = f.default
    if f.size and isinstance(value, int) and value:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % size == 0:
                return f"`{value}` ({value // size} {unit})"
    if value is None:
        text = "unset"
        return f"unset ({f.unset})" if f.unset else text
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (dict, list)):
        return f"`{json.dumps(value)}`"
    if isinstance(value, float):
        return f"`{value!r}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag(f: FieldSpec) -> str:
    if f.kind == "passthrough":
        return f"`--{f.flag.replace('*', '<name>')}`"
    names = [f"`--{f.flag}`"]
    names += [f"`--{s}`" for s in f.switches if s != f.flag]
    names += [f"`--{a}`" for a in f.aliases]
    text = " / ".join(names)
    if f.name != f.flag.replace("-", "_"):
        text += f" (`{f.name}`)"
    return text


def _notes(f: FieldSpec) -> str:
    notes = []
    if f.choices:
        notes.append("one of " + ", ".join(f"`{c}`" for c in f.choices))
    if f.path_kind:
        notes.append(f"{f.path_kind} path" + (" (odd items)" if f.path_layout else ""))
    if f.function_path:
        notes.append("dotted Python path")
    if f.later:
        notes.append("Megatron-LM after 3714d81 (ignored by the pinned parser)")
    elif f.source == "megatron":
        notes.append("Megatron-LM")
    elif f.origin != "relax":
        notes.append(f.origin)
    if f.megatron_default is not None or (f.source == "megatron" and f.name in RELAX_DEFAULTS):
        notes.append(f"Relax's default; Megatron-LM's is {_default_value(f.megatron_default)}")
    if f.source == "relax":
        if f.removed_in_main:
            notes.append(f"Relax {', '.join(f.versions)} only (gone from main {RELAX_MAIN})")
        elif f.versions == (RELAX_MAIN,):
            notes.append(f"Relax main {RELAX_MAIN} (not in the reference commit)")
        if f.changed:
            was = ", ".join(f"{k} was {_default_value(v)}" for k, v in sorted(f.changed.items()))
            notes.append(f"changed in main ({was}): main's definition is used")
    maths = _MATHS_NOTES.get(f.name)
    if maths is not None:
        notes.append(f"**deliberate deviation from Relax's code:** {maths.what} Example: {maths.example}")
    return "; ".join(notes)


def _default_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (dict, list)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def render_parameters_md() -> str:
    total = len(FIELDS)
    lines = [
        "# Relax job spec parameters",
        "",
        "<!-- Generated by `python -m jobspec.docs > docs/reference/parameters.md`; do not edit by hand. -->",
        "",
        f"Every parameter of a Relax Platform job spec ({total} fields in {len(GROUPS)} groups). A spec is a",
        "YAML/JSON object whose keys are these names with `-` or `_`, or the same Relax command-line flags.",
        "Type `flag` is a boolean switch (the flags that set it are listed: `--x`, `--no-x`, `--disable-x`);",
        "`list[...]` takes one or more values (`*`: zero or more; a number: exactly that many); `json` takes",
        "a JSON value. Notes say where a value is a filesystem path (`input`/`output`) or a dotted Python path.",
        "",
        "Where the parameters come from:",
        "",
        "- the sections of the Relax configuration reference (typed from that document);",
        f"- **Megatron-LM**: every argument of {SOURCES['megatron']} (the commit Relax pins), generated",
        "  from Megatron-LM's own parser with `python -m tools.arguments.generate`, with the defaults",
        "  Relax's parser resets (noted per parameter);",
        f"- **Relax's code**: every flag its argument module defines at {SOURCES['relax']['eb15c45']} (the",
        f"  reference) and at {RELAX_MAIN} (main), generated the same way. Where the two differ, main is",
        "  followed and the note says so (see also the list below).",
        "",
        "Megatron-LM flags of versions later than the pinned commit are not parameters: Relax's parser",
        "ignores unknown flags, the spec refuses them by name.",
        "",
        "## Groups",
        "",
    ]
    for gid, (model, names) in GROUPS.items():
        lines.append(f"- [{model.title}](#{gid}) ({len(names)})")
    lines.append("")
    for gid, (model, names) in GROUPS.items():
        lines += [f'<a id="{gid}"></a>', f"## {model.title}", "", f"Group `{gid}`.", ""]
        if model.description:
            lines += [model.description, ""]
        lines += ["| Flag | Type | Default | Notes | Description |", "|---|---|---|---|---|"]
        for name in names:
            f = FIELDS[name]
            lines.append(
                f"| {_flag(f)} | {f.type_label} | {_cell(_default(f))} | {_cell(_notes(f))} | {_cell(f.help)} |"
            )
        lines.append("")
    differ = [f for f in FIELDS.values() if f.source == "relax" and (f.changed or f.removed_in_main)]
    lines += [
        f"## Where Relax's reference commit and main {RELAX_MAIN} differ",
        "",
        "Main's definition is used; a flag that main removed is still accepted with its last definition.",
        "",
        "| Flag | Difference |",
        "|---|---|",
    ]
    for f in differ:
        what = []
        if f.removed_in_main:
            what.append(f"defined at {', '.join(f.versions)}, not in main")
        for key, was in sorted(f.changed.items()):
            what.append(f"{key}: {_default_value(was)} at the reference commit")
        lines.append(f"| {_flag(f)} | {_cell('; '.join(what))} |")
    lines += [
        "",
        "Reference parameters that deliberately differ from Relax's code (main):",
        "",
        "| Parameter | Deviation |",
        "|---|---|",
    ]
    for name, reason in FIELD_DEVIATIONS.items():
        lines.append(f"| {_flag(FIELDS[name])} | {_cell(reason)} |")
    added = sorted(f.flag for f in FIELDS.values() if f.source == "relax" and f.versions == (RELAX_MAIN,))
    lines += ["", f"Flags new in main ({len(added)}): " + ", ".join(f"`--{x}`" for x in added) + ".", ""]
    lines += [
        "## Megatron-LM defaults Relax's parser resets",
        "",
        "| Parameter | Relax | Megatron-LM |",
        "|---|---|---|",
    ]
    for name, value in sorted(RELAX_DEFAULTS.items()):
        f = FIELDS.get(name)
        if f is not None:
            lines.append(f"| {_flag(f)} | {_default_value(value)} | {_default_value(f.megatron_default)} |")
    lines += [
        "",
        "Values Relax derives at start-up (always the distributed optimizer, bf16 unless fp16, …) are",
        "derived-default rules below; `relaxctl spec validate` shows them under `derived`.",
        "",
    ]
    lines += [
        "## Cross-field rules and derived defaults",
        "",
        "Checked by `jobspec.normalize()` in this order (`jobspec/rules/__init__.py`). Each issue carries the code below.",
        "",
        "| Code | Flags | Rule |",
        "|---|---|---|",
    ]
    for r in INPUT_RULES + RULES:
        flags = ", ".join(f"`--{x}`" for x in r.fields)
        lines.append(f"| `{r.code}` | {flags} | {_cell(r.summary)} |")
    lines += [
        "",
        "## Deliberate deviations from Relax's code",
        "",
        "Where a rule, or the platform, does something Relax's code (main) does not, and why. Reference",
        "parameters whose definition differs from the code are listed above, under the differences of",
        "Relax's versions.",
        "",
        "| Code | Flags | Reason |",
        "|---|---|---|",
    ]
    for code, flags, reason in deviations():
        lines.append(f"| `{code}` | {', '.join(f'`--{x}`' for x in flags)} | {_cell(reason)} |")
    lines += [
        "",
        "The RL maths (advantages, losses, metrics) give Relax's numbers for the same data, except where",
        "Relax's code has a bug the platform does not copy (also noted beside each flag above):",
        "",
        "| Flag | Deviation | Example |",
        "|---|---|---|",
    ]
    for d in MATHS_DEVIATIONS:
        lines.append(f"| {_flag(FIELDS[d.field])} | {_cell(d.what)} | {_cell(d.example)} |")
    lines += ["", "## Retired rule codes", "", "| Code | Why |", "|---|---|"]
    for code, why in RETIRED_RULES.items():
        lines.append(f"| `{code}` | {_cell(why)} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    sys.stdout.write(render_parameters_md())


if __name__ == "__main__":
    main()
