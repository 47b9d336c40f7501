"""fastgen's host (Python) work per decode step, on CPU: `python -m bench.fastgen_host [--ref REV ...]`.

On a GPU, fastgen's decode steps are CUDA-graph replays and the host's bookkeeping between them (admission,
the launch's bookkeeping, reading each step's tokens back and ending requests) must stay below the device's
time per step, or the device waits. This measures that bookkeeping where no device runs: the tiny Qwen2
(`runtime.models.tiny`, one layer of width 32) on CPU, `--rows` sequences (default 512 = 64 prompts x 8 samples, as GRPO batches
them) of `--prompt-len` tokens, temperature 1.0, exactly `--new-tokens` new tokens each ("plain": no EOS),
and the same with an EOS id the tiny model draws often ("eos": requests end at different steps, slots are
released, the batch is compacted). Timers wrap the engine's own methods on the instance (nothing of the
engine is replaced; no profiler) and read the thread's CPU time (`time.thread_time`; torch runs on one
thread here), so that other processes on a shared machine inflate the figures less than wall time. Per
decode step:

- `wall`: the timed `generate` (after one warm-up generate) divided by its decode steps; `cpu`: the same
  in CPU time;
- `model`: the decode forward and sampler (`_run_decode`; on CUDA a graph replay) and the prefills;
- `host`: what the host adds per step: `launch` (`_launch_decode` without the model) + `read` (`_drain`:
  reading results back, ending requests) + `admit` (`_admit` without prefills, and `_apply_aborts`) +
  `step` (the rest of `step`, the timers' own cost included);
- `per call`: the rest of `generate` (submissions, seeds, results: work per request, not per step),
  spread over its steps.

`--ref REV` adds rows for `runtime/rollout/fastgen/engine.py` as it was at git revision REV (loaded from
`git show` as a module of its own, beside today's model.py/sampler.py), e.g. the revision before a change.
Each row is the best of `--repeat` timed generates. Options: `--rows`, `--new-tokens`, `--prompt-len`,
`--samples` (per prompt), `--scenarios plain,eos`, `--depth` (pipeline depth of today's engine; CPU
default 1), `--repeat`, `--json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from runtime.devices import Device, DeviceKind
from runtime.rollout.params import SamplingParams

ENGINE_PATH = "runtime/rollout/fastgen/engine.py"
REPO = Path(__file__).resolve().parent.parent
PARTS = ("_run_decode", "_prefill", "_launch_decode", "_drain", "_admit", "_apply_aborts", "step")
# the decoder as small as the tiny model's shape allows, so that its forward is a small part of each step
SMALLEST = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)
EOS_SCENARIO_TOKEN_SHARE = 0.03  # "eos": the id whose share of the plain run's tokens is nearest this


def engine_at(rev: str, workdir: Path) -> ModuleType:
    """The engine module as it was at git revision `rev`."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{ENGINE_PATH}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    name = "fastgen_engine_" + "".join(c if c.isalnum() else "_" for c in rev)
    path = workdir / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def instrument(engine: Any) -> dict[str, float]:
    """Wrap the engine's methods named in PARTS with timers (instance attributes: the engine's own calls,
    `self._run_decode(...)`, find them first); returns the seconds each accumulates."""
    totals = dict.fromkeys(PARTS, 0.0)
    for name in PARTS:
        method = getattr(engine, name)

        def timed(*args: Any, _method: Callable[..., Any] = method, _name: str = name, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                totals[_name] += time.thread_time() - started

        setattr(engine, name, timed)
    return totals


def measure(
    engine_cls: Any,
    model: Path,
    prompts: list[list[int]],
    params: SamplingParams,
    eos: tuple[int, ...],
    repeat: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    engine = engine_cls(
        str(model),
        device=Device(DeviceKind.CPU),
        max_batch_size=len(prompts),
        window_quantum=16,
        eos_token_ids=eos,
        **extra,
    )
    engine.generate(prompts, params)  # warm-up: allocation, first calls
    best: dict[str, Any] | None = None
    for _ in range(repeat):
        totals = instrument(engine)
        started, cpu_started = time.perf_counter(), time.thread_time()
        results = engine.generate(prompts, params)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        for name in PARTS:  # unwrap
            delattr(engine, name)
        steps = engine.stats.decode_steps
        model_s = totals["_run_decode"] + totals["_prefill"]
        parts = {name: 1e6 * seconds / steps for name, seconds in totals.items()}
        row = {
            "steps": steps,
            "tokens": sum(len(r.token_ids) for r in results),
            "wall_ms": 1e3 * wall / steps,
            "cpu_ms": 1e3 * cpu / steps,
            "model_ms": 1e3 * model_s / steps,
            "launch_us": parts["_launch_decode"] - parts["_run_decode"],
            "read_us": parts["_drain"],
            "admit_us": parts["_admit"] - parts["_prefill"] + parts["_apply_aborts"],
        }
        # `step`'s own work beyond its parts (its wrapper included: a few microseconds)
        row["step_us"] = (
            parts["step"]
            - parts["_launch_decode"]
            - parts["_drain"]
            - parts["_admit"]
            - parts["_apply_aborts"]
        )
        row["host_us"] = row["launch_us"] + row["read_us"] + row["admit_us"] + row["step_us"]
        # the rest of generate: submissions, seeds, results (once per request, spread over the steps)
        row["per_call_us"] = 1e6 * (cpu - model_s) / steps - row["host_us"]
        row["finished"] = sorted({r.finish_reason.value for r in results})
        if best is None or row["host_us"] < best["host_us"]:  # (contention only adds)
            best = row
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ref", action="append", default=[], help="also the engine at this git revision")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (rows / samples prompts)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--scenarios", default="plain,eos")
    parser.add_argument("--depth", type=int, default=None, help="today's engine's pipeline_depth")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from runtime.models.tiny import TinyModelShape, build_tiny_model
    from runtime.rollout.fastgen import engine as current

    torch.set_num_threads(1)  # the tiny model's matmuls; the host work is single-threaded anyway
    workdir = Path(tempfile.mkdtemp(prefix="fastgen_host_"))
    model = build_tiny_model(workdir / "tiny", seed=0, shape=TinyModelShape(**SMALLEST))
    gen = torch.Generator().manual_seed(0)
    distinct = max(1, args.rows // args.samples)
    heads = [torch.randint(3, 300, (args.prompt_len,), generator=gen).tolist() for _ in range(distinct)]
    prompts = [p for p in heads for _ in range(args.samples)][: args.rows]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=1)

    engines: list[tuple[str, Any, dict[str, Any]]] = [
        (f"engine@{rev}", engine_at(rev, workdir).FastGenEngine, {}) for rev in args.ref
    ]
    today = {} if args.depth is None else {"pipeline_depth": args.depth}
    engines.append(("working tree", current.FastGenEngine, today))

    # the "eos" scenario's stop id: one the tiny model draws at about EOS_SCENARIO_TOKEN_SHARE of its tokens
    probe = current.FastGenEngine(
        str(model), device=Device(DeviceKind.CPU), max_batch_size=len(prompts), eos_token_ids=()
    )
    drawn = torch.tensor([t for r in probe.generate(prompts, params) for t in r.token_ids])
    share = torch.bincount(drawn).float() / len(drawn)
    eos_id = int((share - EOS_SCENARIO_TOKEN_SHARE).abs().argmin())
    scenarios = {"plain": (), "eos": (eos_id,)}

    rows = []
    for scenario in args.scenarios.split(","):
        for label, cls, extra in engines:
            row = measure(cls, model, prompts, params, scenarios[scenario], args.repeat, extra)
            rows.append({"engine": label, "scenario": scenario, **row})
    report = {
        "rows": args.rows,
        "samples": args.samples,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "eos_id": eos_id,
        "results": rows,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return report
    print(
        f"fastgen host work per decode step, CPU, tiny Qwen2: {args.rows} rows ({args.samples} samples per "
        f"prompt), {args.prompt_len}-token prompts, {args.new_tokens} new tokens, best of {args.repeat}"
    )
    header = (
        "| engine | scenario | steps | wall ms | cpu ms | model ms | host us | launch us | read us | admit us | step us "
        "| per call us |"
    )
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for r in rows:
        print(
            f"| {r['engine']} | {r['scenario']} | {r['steps']} | {r['wall_ms']:.2f} | {r['cpu_ms']:.2f} | "
            f"{r['model_ms']:.2f} | "
            f"{r['host_us']:.0f} | {r['launch_us']:.0f} | {r['read_us']:.0f} | {r['admit_us']:.0f} | "
            f"{r['step_us']:.0f} | {r['per_call_us']:.0f} |"
        )
    return report


if __name__ == "__main__":
    main()
