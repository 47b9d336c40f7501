"""fastgen's decode kernels alone at the GRPO shape, per launch setting, one table (CUDA only).

    python -m bench.gpu_fastgen_kernels                  # times every setting below, prints the best
    python -m bench.gpu_fastgen_kernels --env best.sh    # also writes the best as RELAX_FASTGEN_TRITON_* exports

Shape: one layer of the Qwen2-0.5B decode step at 64 prompts x 8 samples: 512 rows, 2 KV heads of 7 query
heads, head dim 64, bf16, a shared 512-token prompt per group of 8 and `--steps` generated tokens per row.
Attention (`triton_attention.decode_attention`): the kernel measured before (`fused=0`, with the separate
cache write as the model does it) and the fused row kernel per (KV heads per program, block, warps,
stages); the time is the prefix kernel + row kernel (+ cache write), averaged over the listed step counts.
Sampler (`triton_sampler.block_stats`, logits [512, 151,936] bf16): per (blocks per program, warps). Times
are CUDA-graph replays (`triton.testing.do_bench_cudagraph`), in microseconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch


def _bench(fn: Any) -> float:
    import triton.testing

    fn()  # compile outside the graph
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=25)) * 1000.0


def attention_rows(steps: list[int]) -> list[dict[str, Any]]:
    from runtime.rollout.fastgen import triton_attention as ta

    rows_n, hkv, g, d, prefix, group = 512, 2, 7, 64, 512, 8
    t = prefix + max(steps) + 64
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    kv = torch.randn(2, rows_n, hkv, t, d, device=dev, dtype=torch.bfloat16, generator=gen)
    qkv = torch.randn(rows_n, hkv * g + 2 * hkv, d, device=dev, dtype=torch.bfloat16, generator=gen)
    q = qkv[:, : hkv * g].view(rows_n, hkv, g, d)
    new = torch.randn(rows_n, 2, hkv, d, device=dev, dtype=torch.bfloat16, generator=gen)
    slots = torch.arange(rows_n, device=dev)
    settings: list[dict[str, int]] = [dict(fused=0, heads=1, block=64, warps=4, stages=3)]
    for heads, block, warps in itertools.product((1, 2), (32, 64), (4, 8)):
        settings.append(dict(fused=1, heads=heads, block=block, warps=warps, stages=3))
    for heads, stages in itertools.product((1, 2), (2, 4)):
        settings.append(dict(fused=1, heads=heads, block=64, warps=4, stages=stages))
    out = []
    for setting in settings:
        ta.CONFIG.update(setting)
        times = []
        for step in steps:
            lengths = torch.full((rows_n,), prefix + step, device=dev, dtype=torch.int64)

            def call(lengths: torch.Tensor = lengths) -> None:
                if ta.CONFIG["fused"]:
                    ta.decode_attention(
                        q, kv[0], kv[1], lengths, scale=d**-0.5, prefix=prefix, group=group, new=new
                    )
                else:
                    kv[:, slots, :, lengths] = new
                    ta.decode_attention(q, kv[0], kv[1], lengths, scale=d**-0.5, prefix=prefix, group=group)

            try:
                times.append(_bench(call))
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile (registers): skipped
                print(f"attention {setting}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                break
        if len(times) == len(steps):
            out.append({**setting, "us": sum(times) / len(times), "us_per_step": times})
            print(
                f"attention {setting}: {out[-1]['us']:.1f} us ({', '.join(f'{x:.1f}' for x in times)})",
                flush=True,
            )
    return out


def sampler_rows() -> list[dict[str, Any]]:
    from runtime.rollout.fastgen import triton_sampler as ts

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = (torch.randn(512, 151936, device=dev, generator=gen) * 3).to(torch.bfloat16)
    temperature = torch.ones(512, device=dev)
    out = []
    for per, warps in [(1, 4)] + list(itertools.product((2, 4, 8, 16), (4, 8, 16))):
        ts.CONFIG.update(per=per, warps=warps)
        try:
            us = _bench(lambda: ts.block_stats(logits, temperature))
        except Exception as exc:  # noqa: BLE001
            print(f"sampler per={per} warps={warps}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        out.append({"per": per, "warps": warps, "us": us})
        print(f"sampler per={per} warps={warps}: {us:.1f} us", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--steps", default="64,256,448", help="generated tokens per row at which to time attention"
    )
    p.add_argument("--env", default=None, help="write the best settings here as shell exports")
    p.add_argument("--json", default=None, help="also write every row here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_fastgen_kernels needs a CUDA device")
    sampler = sampler_rows()
    best_s = min(sampler, key=lambda r: r["us"])
    before_s = next(r for r in sampler if r["per"] == 1)
    print(f"sampler: before {before_s['us']:.1f} us per step, best {best_s['us']:.1f}: {best_s}")
    lines = [f"export RELAX_FASTGEN_TRITON_SAMPLER_{n.upper()}={best_s[n]}" for n in ("per", "warps")]
    lines.append("export RELAX_FASTGEN_TRITON_FUSED=1")  # the fused row kernel (its settings below)
    _write(args.env, lines)  # now, and again with attention's: a run cut short keeps the sampler's
    attention = attention_rows([int(s) for s in args.steps.split(",")])
    best_a = min((r for r in attention if r["fused"]), key=lambda r: r["us"])
    before_a = next(r for r in attention if not r["fused"])
    print(f"attention: before {before_a['us']:.1f} us per layer, best {best_a['us']:.1f}: {best_a}")
    lines += [
        f"export RELAX_FASTGEN_TRITON_{n.upper()}={best_a[n]}" for n in ("heads", "block", "warps", "stages")
    ]
    _write(args.env, lines)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"attention": attention, "sampler": sampler}, f, indent=1)


def _write(path: str | None, lines: list[str]) -> None:
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
