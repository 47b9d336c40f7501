"""`bench/gpu_grpo.py` on CPU with `--tiny`: our GRPO step end to end (fastgen generates, the megatron backend
trains one optimizer step per rollout, the weights go back into the engine in place), and the loss hook that
takes pi_old from the training pass as TRL does."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]


def test_tiny_ours_row_trains_and_hands_the_weights_to_the_engine(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    out_json = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu_grpo",
        "--tiny",
        "--rows",
        "ours",
        "--warmup",
        "1",
        "--steps",
        "1",
        "--again",
        "1",
    ]
    cmd += ["--lr", "1e-3", "--quiet", "--json", str(out_json)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    (row,) = json.loads(out_json.read_text())
    assert row["row"] == "ours" and "| ours: megatron backend + fastgen" in out.stdout
    assert len(row["losses"]) == 2 and all(math.isfinite(x) for x in row["losses"])
    assert all(math.isfinite(g) and g > 0 for g in row["grad_norms"])  # a real gradient, not a zero loss
    assert row["optimizer_steps"] == 2  # one optimizer step per rollout
    assert row["weight_versions"] == [0, 1, 2]  # the engine took each step's weights, in order
    assert row["weights_moved_max_abs"] > 1e-4  # ... which moved ...
    assert row["engine_vs_trainer_max_abs"] == 0.0  # ... and are exactly the trainer's after the last push
    assert row["gen_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0 and row["train_mfu"] > 0
    assert len(row["generate_again_s"]) == 1 and row["generate_again_s"][0] > 0  # the engine alone, after
    parts = row["parts_s"]
    assert parts["generate"] + parts["batch"] + parts["train"] + parts["sync"] == pytest.approx(parts["step"])


def test_on_policy_loss_takes_pi_old_from_the_same_pass() -> None:
    """Ratio 1 (no clipping, no KL to pi_old), and the gradient of the policy loss: -A / tokens per sample."""
    from bench.gpu_grpo import on_policy_loss
    from runtime.algos.losses import LossConfig, LossInputs

    gen = torch.Generator().manual_seed(0)
    log_probs = (-torch.rand(4, 6, generator=gen) * 3).requires_grad_()
    mask = torch.ones(4, 6)
    mask[:, :2] = 0.0
    advantages = torch.randn(4, 1, generator=gen).expand(4, 6) * mask
    inputs = LossInputs(
        log_probs=log_probs,
        entropy=torch.zeros(4, 6),
        loss_mask=mask,
        advantages=advantages,
        old_log_probs=torch.zeros(4, 6),  # a stale pi_old the hook must not use
        rollout_log_probs=torch.zeros(4, 6),
    )
    loss, metrics = on_policy_loss(inputs, LossConfig())
    assert float(metrics["ppo_kl"]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.0
    assert float(loss.detach()) == pytest.approx(float(-(advantages * mask).sum(1).div(4).mean()), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, -advantages * mask / 4 / 4)


def test_word_tokenizer_gives_one_id_per_word() -> None:
    pytest.importorskip("tokenizers")
    from bench.gpu_grpo import word_tokenizer

    tok = word_tokenizer(1000)
    ids = [5, 999, 2, 17, 17, 10, 100]
    text = " ".join(f"t{i}" for i in ids)
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == text
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
