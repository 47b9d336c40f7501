"""runtime/train/megatron/kernels.py on CPU: the chunked vocab-parallel loss head against full logits (values and
gradients, entropy, temperature, vocabulary padding, TP=2 over gloo in two processes), the norm and activation
paths, and layer compilation (`bench/gpu_train.py --tiny` end to end, its compiled and eager rows:
tests/unit/runtime/megatron/test_bench_backend.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from runtime.train.megatron import kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]


def _case(dtype=torch.float32, s=6, b=3, h=16, v_rows=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(s, b, h, generator=g, dtype=dtype)
    weight = torch.randn(v_rows, h, generator=g, dtype=dtype) * 0.5
    return hidden, weight, g


def _grads(fn, hidden, weight, coef_lp, coef_ent):
    hidden = hidden.detach().clone().requires_grad_(True)
    weight = weight.detach().clone().requires_grad_(True)
    lp, ent = fn(hidden, weight)
    loss = (lp * coef_lp).sum() + ((ent * coef_ent).sum() if ent is not None else 0.0)
    loss.backward()
    return lp.detach(), (ent.detach() if ent is not None else None), hidden.grad, weight.grad


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_head_matches_full_logits(temperature, chunk):
    hidden, weight, g = _case()
    vocab = 33  # rows 33..39 are padding
    targets = torch.randint(0, vocab, hidden.shape[:-1], generator=g)
    c_lp = torch.randn(targets.shape, generator=g)
    c_ent = torch.randn(targets.shape, generator=g)

    ours = _grads(
        lambda h, w: kernels.token_log_probs_and_entropy(
            h, w, targets, vocab_size=vocab, temperature=temperature, chunk_tokens=chunk
        ),
        hidden,
        weight,
        c_lp,
        c_ent,
    )
    ref = _grads(
        lambda h, w: kernels.reference_log_probs_and_entropy(
            h, w, targets, vocab_size=vocab, temperature=temperature
        ),
        hidden,
        weight,
        c_lp,
        c_ent,
    )
    for got, want in zip(ours, ref, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.all(ours[3][vocab:] == 0), "padding rows must get no gradient"
    assert ours[0].shape == targets.shape and ours[1].shape == targets.shape


def test_padding_rows_are_not_in_the_softmax():
    hidden, weight, g = _case()
    vocab = 30
    targets = torch.randint(0, vocab, hidden.shape[:-1], generator=g)
    w_big = weight.clone()
    w_big[vocab:] = 100.0  # huge logits on the padding rows would dominate a softmax that saw them
    lp, ent = kernels.token_log_probs_and_entropy(hidden, w_big, targets, vocab_size=vocab, chunk_tokens=4)
    lp0, ent0 = kernels.reference_log_probs_and_entropy(hidden, weight[:vocab], targets)
    torch.testing.assert_close(lp, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent0, rtol=1e-5, atol=1e-5)
    assert torch.all(torch.exp(lp) <= 1) and torch.all(ent >= 0)


def test_exact_in_fp64_and_gradcheck():
    hidden, weight, g = _case(dtype=torch.float64, s=3, b=2, h=5, v_rows=9)
    targets = torch.randint(0, 7, hidden.shape[:-1], generator=g)

    def f(h, w):
        lp, ent = kernels.token_log_probs_and_entropy(
            h, w, targets, vocab_size=7, temperature=0.8, chunk_tokens=4
        )
        return lp, ent

    assert torch.autograd.gradcheck(f, (hidden.requires_grad_(True), weight.requires_grad_(True)))


def test_save_logits_and_no_entropy():
    hidden, weight, g = _case()
    targets = torch.randint(0, 40, hidden.shape[:-1], generator=g)
    c_lp = torch.randn(targets.shape, generator=g)
    zero = torch.zeros(targets.shape)
    a = _grads(
        lambda h, w: kernels.token_log_probs_and_entropy(h, w, targets, chunk_tokens=7, save_logits=True),
        hidden,
        weight,
        c_lp,
        zero,
    )
    b = _grads(
        lambda h, w: kernels.token_log_probs_and_entropy(h, w, targets, chunk_tokens=7, with_entropy=False),
        hidden,
        weight,
        c_lp,
        zero,
    )
    assert b[1] is None
    for x, y in zip((a[0], a[2], a[3]), (b[0], b[2], b[3]), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_bf16_inputs_give_fp32_outputs_close_to_reference():
    hidden, weight, g = _case(h=32, v_rows=64)
    targets = torch.randint(0, 64, hidden.shape[:-1], generator=g)
    hb = hidden.bfloat16().requires_grad_(True)
    wb = weight.bfloat16().requires_grad_(True)
    lp, ent = kernels.token_log_probs_and_entropy(hb, wb, targets, chunk_tokens=5)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    (lp.sum() + 0.1 * ent.sum()).backward()
    assert hb.grad.dtype == torch.bfloat16 and wb.grad.dtype == torch.bfloat16
    lp0, ent0 = kernels.reference_log_probs_and_entropy(hb.detach(), wb.detach(), targets)
    torch.testing.assert_close(lp, lp0, rtol=0, atol=0.05)
    torch.testing.assert_close(ent, ent0, rtol=0, atol=0.05)


def test_argument_checks():
    hidden, weight, g = _case()
    targets = torch.zeros(hidden.shape[:-1], dtype=torch.long)
    with pytest.raises(ValueError):
        kernels.token_log_probs_and_entropy(hidden, weight, targets[:2])
    with pytest.raises(ValueError):
        kernels.token_log_probs_and_entropy(hidden, weight, targets, vocab_size=41)
    with pytest.raises(ValueError):
        kernels.token_log_probs_and_entropy(hidden, weight, targets, temperature=0.0)
    # [tokens, h] input works too
    lp, ent = kernels.token_log_probs_and_entropy(hidden.reshape(-1, 16), weight, targets.reshape(-1))
    assert lp.shape == (18,)


_TP_WORKER = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from runtime.train.megatron.kernels import token_log_probs_and_entropy
    rank, out = int(sys.argv[1]), sys.argv[2]
    # a file rendezvous: no port to pick and lose to a neighbour (pytest-xdist workers run beside it)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    case = torch.load(out + "/case.pt")
    results = {}
    for name, (hidden, weight, targets, vocab, temp, c_lp, c_ent) in case.items():
        shard = weight.shape[0] // 2
        h = hidden.clone().requires_grad_(True)
        w = weight[rank * shard:(rank + 1) * shard].clone().requires_grad_(True)
        lp, ent = token_log_probs_and_entropy(h, w, targets, vocab_size=vocab, temperature=temp,
                                              tp_group=dist.group.WORLD, chunk_tokens=4)
        ((lp * c_lp).sum() + (ent * c_ent).sum()).backward()
        results[name] = (lp.detach(), ent.detach(), h.grad, w.grad)
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.barrier()
    # leave without tearing gloo down: its teardown can abort ("terminate called without an active
    # exception") when the peer is already gone, after the results are safely written
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_tensor_parallel_two_ranks_on_gloo_match_one_process(tmp_path):
    g = torch.Generator().manual_seed(3)
    case = {}
    # (padded rows, real vocab): rank 1 holds some padding; rank 1 holds only padding
    for name, rows, vocab, temp in (("some_padding", 40, 35, 1.0), ("rank1_all_padding", 40, 20, 0.7)):
        hidden = torch.randn(5, 2, 8, generator=g)
        weight = torch.randn(rows, 8, generator=g)
        targets = torch.randint(0, vocab, (5, 2), generator=g)
        targets[0, 0] = vocab - 1
        case[name] = (
            hidden,
            weight,
            targets,
            vocab,
            temp,
            torch.randn(5, 2, generator=g),
            torch.randn(5, 2, generator=g),
        )
    torch.save(case, tmp_path / "case.pt")
    script = tmp_path / "worker.py"
    script.write_text(_TP_WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-3000:]
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for name, (hidden, weight, targets, vocab, temp, c_lp, c_ent) in case.items():
        ref = _grads(
            lambda h, w, t=targets, v=vocab, tt=temp: kernels.reference_log_probs_and_entropy(
                h, w, t, vocab_size=v, temperature=tt
            ),
            hidden,
            weight,
            c_lp,
            c_ent,
        )
        shard = weight.shape[0] // 2
        for rank, res in ((0, r0[name]), (1, r1[name])):
            lp, ent, gh, gw = res
            torch.testing.assert_close(lp, ref[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ent, ref[1], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gh, ref[2], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gw, ref[3][rank * shard : (rank + 1) * shard], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ norm / activation


def test_rms_norm_matches_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 24, generator=g, requires_grad=True)
    norm = kernels.RMSNorm(hidden_size=24, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24, generator=g))
    ref = torch.nn.RMSNorm(24, eps=1e-6)
    ref.load_state_dict(norm.state_dict())  # same parameter names
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = norm(x), ref(x2)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-6)
    y.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)
    xb = x.detach().bfloat16()
    assert kernels.rms_norm(xb, norm.weight.detach(), 1e-6).dtype == torch.bfloat16


def test_swiglu():
    x = torch.randn(5, 2, 12)
    a, b = x[..., :6], x[..., 6:]
    torch.testing.assert_close(kernels.swiglu(x), torch.nn.functional.silu(a) * b)


def test_compiled_kernels_are_cuda_only():
    assert not kernels.compiled_kernels_enabled(torch.zeros(1))


def test_cuda_fusions_leave_cpu_configs_alone():
    cfg = object()
    assert kernels.cuda_fusions(cfg) is cfg


_TRITON_CHECK = textwrap.dedent(
    """
    import os, torch
    from runtime.train.megatron import kernels as K
    K._STATS_BLOCK, K._GRAD_BLOCK = 16, 32  # several blocks per row: the online max is exercised
    torch.manual_seed(0)
    worst = 0.0
    for temp, vocab, rows, h in ((1.0, 45, 50, 16), (0.7, 30, 40, 8), (1.3, 300, 300, 12)):
        hid = torch.randn(13, h)
        w = torch.randn(rows, h) * 0.7
        t = torch.randint(0, vocab, (13,))
        c1, c2 = torch.arange(13.0), torch.linspace(-1, 1, 13)
        got = {}
        for impl in ("eager", "triton"):
            for save in (False, True):
                os.environ["RELAX_HEAD_KERNEL"] = impl
                a, b = hid.clone().requires_grad_(True), w.clone().requires_grad_(True)
                lp, ent = K.token_log_probs_and_entropy(a, b, t, vocab_size=vocab, temperature=temp,
                                                       chunk_tokens=5, save_logits=save)
                ((lp * c1).sum() + (ent * c2).sum()).backward()
                got[impl, save] = (lp.detach(), ent.detach(), a.grad, b.grad)
        ref = got["eager", False]
        for key, vals in got.items():
            for x, y in zip(vals, ref):
                worst = max(worst, float((x - y).abs().max() / y.abs().max().clamp_min(1e-6)))
    print("WORST", worst)
    assert worst < 1e-5, worst
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (CUDA hosts have it)"
)
def test_triton_head_kernels_match_eager_in_the_interpreter(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(_TRITON_CHECK)
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def test_a_failing_triton_kernel_falls_back_to_the_torch_path(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel here")

    class Launcher:
        def __getitem__(self, grid):
            return broken

    monkeypatch.setattr(kernels, "_triton_kernels", (Launcher(), Launcher()))
    monkeypatch.setenv("RELAX_HEAD_KERNEL", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets `_head_impl` pick triton for CPU tensors
    hidden, weight, g = _case()
    targets = torch.randint(0, 40, hidden.shape[:-1], generator=g)
    c = torch.randn(targets.shape, generator=g)
    with pytest.warns(RuntimeWarning, match="Triton head kernel failed"):
        got = _grads(
            lambda h, w: kernels.token_log_probs_and_entropy(h, w, targets, chunk_tokens=7),
            hidden,
            weight,
            c,
            c,
        )
    assert kernels._triton_kernels is False
    monkeypatch.setenv("RELAX_HEAD_KERNEL", "eager")
    want = _grads(
        lambda h, w: kernels.token_log_probs_and_entropy(h, w, targets, chunk_tokens=7), hidden, weight, c, c
    )
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y)
