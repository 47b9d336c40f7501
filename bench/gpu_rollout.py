"""Rollout throughput of fastgen (runtime/rollout/fastgen) against Hugging Face `generate`, one table.

    python -m bench.gpu_rollout                        # Qwen2-0.5B shape, 512 x (512 prompt + 512 new), CUDA
    python -m bench.gpu_rollout --attention flex,sdpa,bmm,sdpa_full   # one row per decode-attention strategy
    python -m bench.gpu_rollout --samples-per-prompt 1,8  # + GRPO's shape: 64 prompts x 8 samples each
    python -m bench.gpu_rollout --skip-hf              # fastgen rows only (HF generate takes ~10 s warm)
    python -m bench.gpu_rollout --tiny                 # a tiny shape and batch: runs anywhere (CPU here)

The model is a random-initialised `Qwen2ForCausalLM` built from a `Qwen2Config` of the Qwen2-0.5B shape
(vocab 151,936, 24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864, tied embeddings, rope theta
1e6), bf16 on CUDA (fp32 on CPU); no hub download. Every prompt is `--prompt-len` random tokens; every
sequence gets exactly `--new-tokens` new tokens (no EOS: fastgen with `eos_token_ids=()`, HF with no
`eos_token_id`), temperature `--temperature`, no top-k/top-p. `--samples-per-prompt n` makes the workload
GRPO-shaped: `num_seqs / n` distinct prompts, each repeated n times in a row (fastgen prefills each
distinct prompt once and, by default, decode reads each shared prompt once per group: cascade attention,
`--no-prefix-attention` turns that off); a comma list gives one fastgen row per value. Each engine runs the whole workload once
untimed (warm-up: CUDA graphs captured, allocator warmed) and then `--repeats` timed times (the best is
reported).

Columns: new tokens/s over the whole call (prefill included), ms per decode step ((wall - prefill) /
decode steps; fastgen times its prefill by synchronising around each prefill chunk, HF's prefill is
estimated by a `generate` of one new token), prefill seconds, wall seconds, peak GiB allocated during the
timed call (the HF model's weights, which both rows share, included). Then the log-prob check: for
`--check-seqs` sequences of fastgen's output, the max and mean |log-prob(fastgen) - log-prob(HF forward
over prompt + response, same dtype)| under softmax(logits / T).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Row:
    name: str
    tokens_per_s: float
    ms_per_step: float
    prefill_s: float
    wall_s: float
    peak_gib: float
    extra: dict[str, float]


def build_model(tiny: bool, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if tiny:
        shape = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    else:
        shape = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2)  # fmt: skip
    config = Qwen2Config(
        **shape,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0


def run_fastgen(
    model: Any, prompts: list[list[int]], args: argparse.Namespace, attention: str | None, label: str = ""
) -> tuple[Row, list]:  # type: ignore[type-arg]
    from runtime.devices import Device, DeviceKind
    from runtime.rollout.fastgen import FastGenEngine
    from runtime.rollout.params import SamplingParams

    device = next(model.parameters()).device
    engine = FastGenEngine.from_hf_model(
        model,
        device=Device(DeviceKind.CUDA if device.type == "cuda" else DeviceKind.CPU),
        max_batch_size=args.num_seqs,
        decode_attention=attention,
        cuda_graphs=not args.no_cuda_graphs,
        max_prefill_tokens=args.max_prefill_tokens,
        window_quantum=args.window_quantum,
        eos_token_ids=(),
        dtype=next(model.parameters()).dtype,
        timing=True,
        compile=args.compile,
        prefix_attention=not args.no_prefix_attention,
    )
    compiled = args.compile if args.compile is not None else device.type == "cuda"
    attention = engine.decoder.decode_attention
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.new_tokens, seed=args.seed)
    started = time.perf_counter()
    engine.generate(prompts, params)  # warm-up: graphs captured, cache allocated
    sync(device)
    warmup_s = time.perf_counter() - started
    best: tuple[Row, list] | None = None  # type: ignore[type-arg]
    for _ in range(args.repeats):
        peak_reset(device)
        sync(device)
        started = time.perf_counter()
        results = engine.generate(prompts, params)
        sync(device)
        wall = time.perf_counter() - started
        stats = engine.stats
        new = sum(len(r.token_ids) for r in results)
        assert new == len(prompts) * args.new_tokens, f"expected exactly {args.new_tokens} new tokens each"
        decode_s = wall - stats.prefill_seconds
        row = Row(
            f"fastgen[{attention}{',compiled' if compiled else ''}{'' if engine.graphs is not None else ',eager'}{',no-cascade' if args.no_prefix_attention else ''}]{label}",
            new / wall,
            1000 * decode_s / max(1, stats.decode_steps),
            stats.prefill_seconds,
            wall,
            peak_gib(device),
            {
                "decode_steps": stats.decode_steps,
                "prefilled": stats.prefill_tokens,
                "shared_steps": stats.shared_steps,
                "graphs": stats.graph_captures,
                "warmup_s": round(warmup_s, 2),
            },
        )
        if best is None or row.wall_s < best[0].wall_s:
            best = (row, results)
    assert best is not None
    if args.profile:
        profile(engine, prompts, params, args)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return best


def profile(engine: Any, prompts: list[list[int]], params: Any, args: argparse.Namespace) -> None:
    """A torch.profiler table of one more call (kernel times: what a decode step spends where)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        engine.generate(prompts, params)
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.profile))


def run_hf(model: Any, prompts: list[list[int]], args: argparse.Namespace) -> Row:
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)

    def generate(new: int) -> None:
        config = GenerationConfig(
            do_sample=args.temperature > 0,
            temperature=args.temperature if args.temperature > 0 else None,
            top_k=0 if args.temperature > 0 else None,
            top_p=1.0 if args.temperature > 0 else None,
            max_new_tokens=new,
            min_new_tokens=new,
            eos_token_id=None,
            pad_token_id=0,
        )
        for start in range(0, len(prompts), args.hf_batch):
            model.generate(
                input_ids=ids[start : start + args.hf_batch],
                attention_mask=mask[start : start + args.hf_batch],
                generation_config=config,
            )

    generate(args.new_tokens)  # warm-up
    sync(device)
    started = time.perf_counter()
    generate(1)
    sync(device)
    prefill = time.perf_counter() - started
    peak_reset(device)
    started = time.perf_counter()
    generate(args.new_tokens)
    sync(device)
    wall = time.perf_counter() - started
    new = len(prompts) * args.new_tokens
    steps = args.new_tokens - 1
    batches = -(-len(prompts) // args.hf_batch)
    return Row("hf generate", new / wall, 1000 * (wall - prefill) / max(1, steps * batches), prefill, wall,
               peak_gib(device), {"batch": args.hf_batch})  # fmt: skip


def logprob_check(
    model: Any, prompts: list[list[int]], results: list, args: argparse.Namespace
) -> dict[str, float]:  # type: ignore[type-arg]
    device = next(model.parameters()).device
    temperature = args.temperature if args.temperature > 0 else 1.0
    worst, total, count = 0.0, 0.0, 0
    step = max(1, len(prompts) // args.check_seqs)
    with torch.no_grad():
        for i in range(0, len(prompts), step)[: args.check_seqs]:
            prompt, response = prompts[i], results[i].token_ids
            ids = torch.tensor([prompt + response], device=device)
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            expected = torch.log_softmax(logits / temperature, dim=-1).gather(
                -1, torch.tensor(response, device=device)[:, None]
            )[:, 0]
            diff = (expected.cpu() - torch.tensor(results[i].log_probs)).abs()
            worst = max(worst, float(diff.max()))
            total += float(diff.sum())
            count += diff.numel()
    return {
        "max_abs": worst,
        "mean_abs": total / max(1, count),
        "sequences": len(range(0, len(prompts), step)[: args.check_seqs]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model and batch (CPU-friendly)")
    parser.add_argument("--num-seqs", type=int, default=None, help="sequences (default 512; tiny 8)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 512; tiny 16)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens each (default 512; tiny 16)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--attention",
        default="default",
        help="fastgen decode attention(s), comma-separated: default,flex,sdpa,bmm,sdpa_full",
    )
    parser.add_argument(
        "--samples-per-prompt",
        default="1",
        help="n samples per distinct prompt (GRPO shape), comma-separated for one row each: 1,8",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fastgen: torch.compile the decode layers' element-wise parts and the sampler "
        "(default: on CUDA)",
    )
    parser.add_argument(
        "--no-prefix-attention",
        action="store_true",
        help="fastgen: attend per row even when samples share a prompt (prefill is still shared)",
    )
    parser.add_argument("--no-cuda-graphs", action="store_true", help="fastgen decode eagerly")
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="padded tokens per prefill forward (fastgen default 16384 on CUDA)",
    )
    parser.add_argument("--window-quantum", type=int, default=128, help="decode attention window rounding")
    parser.add_argument("--skip-hf", action="store_true", help="no HF generate row")
    parser.add_argument("--hf-batch", type=int, default=None, help="HF generate batch size (default: all)")
    parser.add_argument(
        "--check-seqs", type=int, default=8, help="sequences for the log-prob check (0: none)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per engine (best kept)")
    parser.add_argument(
        "--profile", type=int, default=0, help="print a profiler table of N rows (one more fastgen call)"
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--dtype", default=None, help="bfloat16 / float32 (default: bf16 on CUDA, fp32 on CPU)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    small = args.tiny
    args.num_seqs = args.num_seqs or (8 if small else 512)
    args.prompt_len = args.prompt_len or (16 if small else 512)
    args.new_tokens = args.new_tokens or (16 if small else 512)
    args.hf_batch = args.hf_batch or args.num_seqs
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    if device.type == "cpu" and not small:
        print("warning: the full shape on CPU takes very long; use --tiny")

    model = build_model(small, device, dtype, args.seed)
    vocab = model.config.vocab_size

    def make_prompts(per_prompt: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(args.seed)
        distinct = -(-args.num_seqs // per_prompt)
        base = torch.randint(1, vocab, (distinct, args.prompt_len), generator=gen).tolist()
        return [base[i // per_prompt] for i in range(args.num_seqs)]

    shares = [int(n) for n in str(args.samples_per_prompt).split(",") if n.strip()]
    prompts = make_prompts(shares[0])
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, {dtype}, {device}; "
          f"{args.num_seqs} seqs x {args.prompt_len} prompt + {args.new_tokens} new, T={args.temperature}")  # fmt: skip

    rows: list[Row] = []
    checks: dict[str, dict[str, float]] = {}
    for per_prompt in shares:
        prompts = make_prompts(per_prompt)
        label = "" if per_prompt == 1 else f" {-(-args.num_seqs // per_prompt)}x{per_prompt}"
        for attention in [a.strip() for a in args.attention.split(",") if a.strip()]:
            chosen = None if attention == "default" else attention
            row, results = run_fastgen(model, prompts, args, chosen, label)
            rows.append(row)
            if args.check_seqs:
                checks[row.name] = logprob_check(model, prompts, results, args)
    if not args.skip_hf:
        rows.append(run_hf(model, prompts, args))

    header = f"{'engine':<34} {'new tok/s':>12} {'ms/step':>9} {'prefill s':>10} {'wall s':>8} {'peak GiB':>9}  extra"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.name:<34} {r.tokens_per_s:>12,.0f} {r.ms_per_step:>9.2f} {r.prefill_s:>10.3f} {r.wall_s:>8.3f} "
              f"{r.peak_gib:>9.2f}  {json.dumps(r.extra)}")  # fmt: skip
    for name, check in checks.items():
        print(f"log-prob check {name}: max |engine - HF forward| = {check['max_abs']:.4g}, "
              f"mean = {check['mean_abs']:.3g} over {int(check['sequences'])} sequences ({dtype})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "rows": [r.__dict__ for r in rows], "logprob_check": checks}, f, indent=2
            )


if __name__ == "__main__":
    main()
