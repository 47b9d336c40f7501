"""`bench/gpu_train.py --tiny` on CPU, one process (world 1, gloo): the plain HF row, ours with the layers compiled
(aot_eager) and eagerly, which see the same losses; the backend rows: `MegatronTrainBackend` built from a
config.json-only folder with `random_init`, trained with `train_step` (SFT) in the bench's timing loop, the head
keeping its logits (`backend-save`) giving the same losses as recomputing them; the bench's spec values are the
ones `load_spec` derives."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[4]


def test_bench_tiny_runs_on_cpu(tmp_path: Path, subtests: pytest.Subtests) -> None:
    """`python -m bench.gpu_train --tiny` end to end on CPU, every row in one process (a bench run each cost
    one more process importing torch and megatron-core, and one more `ours` row: test_kernels.py had the first
    three rows, this module the last two): the plain HF row and ours, with the transformer layers compiled
    (aot_eager: dynamo + AOT autograd without code generation) and without, whose losses must agree (same seed,
    same data); then the backend rows."""
    out_json = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    env.pop("RELAX_HEAD_SAVE_LOGITS", None)
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu_train",
        "--tiny",
        "--quiet",
        "--rows",
        "hf,ours,ours-eager,backend,backend-save",
        "--compile-backend",
        "aot_eager",  # the `ours` and `hf` rows' layers; the backend rows compile nothing on CPU
        "--json",
        str(out_json),
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("| tiny")]
    assert len(lines) == 5, out.stdout
    assert (
        "| model | loop | step s | tokens/s | TFLOP/s (per GPU) | MFU | peak GiB | first step s |"
        in out.stdout
    )
    rows = json.loads(out_json.read_text())
    assert (
        [r["loop"] for r in rows]
        == [
            "plain HF + torch.compile + chunked loss",
            "ours (megatron-core + our kernels)",
            "ours (megatron-core + our kernels), no torch.compile",
            "ours (megatron backend: MegatronTrainBackend.train_step, sft), head recomputes logits, thd",  # CPU: auto
            "ours (megatron backend: MegatronTrainBackend.train_step, sft), head keeps bf16 logits, thd",
        ]
    ), out.stdout

    with subtests.test("the compiled layers match eager"):
        compiled, eager = rows[1]["losses"], rows[2]["losses"]
        assert len(compiled) == len(eager) == 3
        for a, b in zip(compiled, eager, strict=True):
            assert abs(a - b) < 1e-4, (compiled, eager)

    with subtests.test("the backend rows"):
        recompute, save = rows[3]["losses"], rows[4]["losses"]
        assert len(recompute) == len(save) == 3  # 1 warm-up + 2 timed steps
        # random init: the first loss is about log(vocab) (1000 ids); training moves it
        assert abs(recompute[0] - math.log(1000)) < 0.5, recompute
        assert all(math.isfinite(x) for x in recompute)
        for a, b in zip(recompute, save, strict=True):
            assert abs(a - b) < 1e-4, (recompute, save)
        for r in rows[3:]:
            assert r["tokens_per_s"] > 0 and r["mfu"] > 0


def test_bench_backend_values_are_what_the_spec_derives(tmp_path):
    """The bench writes the backend's values out (no jobspec on a bare GPU image); they must be the normalized
    spec's for the same job."""
    pytest.importorskip("pydantic")
    from bench.gpu_train import SHAPES, Cfg, backend_values, qwen2_config
    from runtime.spec import load_spec

    cfg = Cfg(micro_batch=2, seq=32, accum=2, chunk_tokens=24)
    shape = SHAPES["tiny"]
    (tmp_path / "config.json").write_text(json.dumps(qwen2_config(shape, cfg)))
    mine = backend_values(shape, cfg, tp=1)
    spec = load_spec(
        {
            "train-backend": "megatron",
            "hf-checkpoint": str(tmp_path),
            "prompt-data": "unused.jsonl",
            "rollout-batch-size": cfg.micro_batch * cfg.accum,
            "num-rollout": 1,
            "loss-type": "sft",
            "use-dynamic-batch-size": True,
            "max-tokens-per-gpu": cfg.micro_batch * cfg.seq,
            "hidden-dropout": 0.0,
            "attention-dropout": 0.0,
            "accumulate-allreduce-grads-in-fp32": True,
            "log-probs-chunk-size": cfg.chunk_tokens,
            "seq-length": cfg.seq,
            "micro-batch-size": cfg.micro_batch,
            "tensor-model-parallel-size": 1,
        }
    )
    values = spec.values()
    differing = {k: (v, values.get(k)) for k, v in mine.items() if values.get(k) != v}
    assert not differing, differing
    # and every value the backend reads that the spec sets (fp16 loss scaling aside: the bench runs bf16)
    source = "".join(
        (ROOT / "runtime/train/megatron" / name).read_text()
        for name in ("backend.py", "model.py", "parallel.py")
    )
    read = set(re.findall(r'_get\(self\.values, "(\w+)"', source))
    read |= set(re.findall(r'values\.get\("(\w+)"\)', source)) | set(re.findall(r'get\("(\w+)", ', source))
    fp16_only = {"hysteresis", "initial_loss_scale", "loss_scale", "loss_scale_window", "min_loss_scale"}
    unset = {
        k: values[k]
        for k in sorted(read - fp16_only)
        if values.get(k) not in (None, False) and k not in mine and k != "optimizer_offload_fraction"
    }
    assert not unset, unset


def test_idle_gaps_charges_device_waits_to_the_host_op_running_when_they_began():
    """`bench.gpu_train.idle_gaps` over hand-made profiler events: kernels at [0, 10), [10, 20), [50, 60) and
    [61, 70) us; a host `aten::to` (with a `cudaStreamSynchronize` inside) spans the 20..50 gap, nothing spans
    the 60..61 one (under the 20 us threshold either way)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from bench.gpu_train import idle_gaps

    def event(name, start, end, device):
        return SimpleNamespace(
            name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device
        )

    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [
        event("k1", 0, 10, cuda),
        event("k2", 10, 20, cuda),
        event("k3", 50, 60, cuda),
        event("k4", 61, 70, cuda),
        event("aten::to", 15, 52, cpu),
        event("cudaStreamSynchronize", 18, 49, cpu),
        event("aten::mm", 0, 5, cpu),
    ]
    text = idle_gaps(events)
    assert "30.0 us" not in text  # reported in ms
    assert "device idle in gaps >= 20 us: 0.0 ms of 0.1 ms (1 gaps)" in text
    assert "| aten::to > cudaStreamSynchronize | 1 | 0.0 |" in text
    assert idle_gaps([event("aten::mm", 0, 5, cpu)]) == "no device activity recorded\n"
