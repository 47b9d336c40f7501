"""MegatronTrainBackend on CPU (gloo), two ranks in two processes, against the torch backend on the same tiny
model in fp32: the same log-probs, the same loss and gradient norm (the same micro-batch weighting), the
same weights after the optimizer steps, under TP=2, DP=2 and PP=2; checkpoints in torch_dist restore the
weights and honour --no-load-optim and --finetune. Then precision and the optimizer: fp16 with dynamic loss
scaling against fp32 (and an overflowing scale), the optimizer offloaded to the CPU against bf16 without it,
and async saves with retention resuming exactly."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.unit.runtime import ranks

TOLERANCE = {"log_probs": 1e-5, "metrics": 1e-4, "weights": 1e-4}


def _values(model: Path, **overrides: Any) -> dict[str, Any]:
    from runtime.spec import load_spec

    spec = load_spec(
        {
            "train-backend": "megatron",
            "hf-checkpoint": str(model),
            "prompt-data": "unused.jsonl",
            "rollout-batch-size": 4,
            "num-rollout": 1,
            "rm-type": "math",
            "colocate": True,
            "hidden-dropout": 0.0,
            "attention-dropout": 0.0,
            **overrides,
        }
    )
    values = spec.values()
    values["bf16"] = False  # fp32, to compare with the torch backend exactly (Relax derives bf16)
    return values


def _batch(n: int = 8, seed: int = 0):
    from runtime.types import RolloutBatch, Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt, response = 5 + i % 3, 3 + i % 5  # ragged: right padding and uneven micro-batches
        tokens = torch.randint(3, 300, (prompt + response,), generator=g).tolist()
        samples.append(
            Sample(
                i, i // 4, "p", tokens=tokens, response_length=response, rollout_log_probs=[-1.0] * response
            )
        )
    batch = RolloutBatch.from_samples(samples, 0)
    batch.advantages = batch.loss_mask * torch.randn(n, 1, generator=g)
    return batch


# padded rows instead of packed sequences (Relax wants --micro-batch-size with bshd; _config's is 2)
BSHD = {"qkv-format": "bshd", "micro-batch-size": 2}

# dynamic batch size (micro-batches of at most 24 tokens, so ranks get different micro-batch counts) with a
# per-token loss: the other weighting of micro-batches
DYNAMIC = {"max_tokens_per_micro_batch": 24, "per_token_loss": True}


def _config(**overrides: Any):
    from runtime.algos.losses import LossConfig
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig

    per_token = overrides.pop("per_token_loss", False)
    return TrainConfig(
        lr_schedule=LRSchedule(lr=1e-3),
        global_batch_size=4,
        micro_batch_size=2,
        weight_decay=0.0,
        loss=LossConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01, per_token_loss=per_token),
        **overrides,
    )


def _worker(
    rank: int, world: int, port: int, model: str, overrides: dict, out: str, checkpoints: bool
) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class

    overrides = dict(overrides)
    config = _config(**overrides.pop("config", {}))
    context = TrainContext(rank, world, "127.0.0.1", port, _values(Path(model), **overrides))
    backend = train_backend_class("megatron")(
        model, config, device=Device.detect(), need_ref=True, context=context
    )
    batch = backend.compute_log_probs(_batch())
    metrics = backend.train_step(batch)
    result: dict[str, Any] = {
        "old": batch.old_log_probs,
        "ref": batch.ref_log_probs,
        "metrics": metrics,
        "weights": backend.named_weights(),
        "checksum": backend.parameter_checksum(),
        "compiled_layers": backend.compiled_layers,
        "fused_adam": backend.fused_adam,
    }
    if checkpoints:
        save = Path(out).parent / "ckpt"
        record = backend.save_checkpoint(str(save), 0, {"data": {"position": 7}})
        saved = backend.named_weights()
        backend.train_step(batch)  # move away from the checkpoint
        moved = backend.named_weights()
        iteration, extra = backend.load_checkpoint(str(save))
        loaded = backend.named_weights()
        steps = backend.optimizer_steps
        backend.values["no_load_optim"] = True
        backend.train_step(batch)
        backend.load_checkpoint(str(save))
        backend.values["no_load_optim"] = False
        backend.values["finetune"] = True
        finetune = backend.load_checkpoint(str(save))
        backend.export_hf(str(Path(out).parent / "hf"), 0)
        # --no-save-optim: the weights only; loading refreshes the optimizer's copy of them
        import dataclasses

        backend.config = dataclasses.replace(backend.config, save_optimizer=False)
        backend.values["finetune"] = False
        backend.save_checkpoint(str(save), 1, {})
        backend.train_step(batch)
        result["without_optimizer"] = backend.load_checkpoint(str(save))
        result["loaded_without_optimizer"] = backend.named_weights()
        # `ref-load` naming a checkpoint root of this backend: the policy (and reference) start from it
        from runtime.train.megatron.parallel import destroy_parallel

        destroy_parallel(process_group=False)
        from_ckpt = train_backend_class("megatron")(
            model, _config(ref_load=str(save)), device=Device.detect(), need_ref=True, context=context
        )
        result["from_ref_load"] = from_ckpt.named_weights()
        result.update(
            record=None if record is None else record.path,
            iteration=iteration,
            extra=extra,
            saved=saved,
            moved=moved,
            loaded=loaded,
            steps=steps,
            finetune=finetune,
            after_finetune=backend.named_weights(),
        )
        result["fused_after_load"] = backend.fused_adam
        result["steps_on_device"] = all(
            state["step"].device == param.device
            for inner in getattr(backend.optimizer, "chained_optimizers", [backend.optimizer])
            for param, state in inner.optimizer.state.items()
            if "step" in state
        )
    if rank == 0:
        torch.save(result, out)


def _spawn(model: Path, tmp_path: Path, overrides: dict, *, checkpoints: bool = False) -> dict[str, Any]:
    from runtime.train.megatron.parallel import free_port

    out = tmp_path / "result.pt"
    ranks.spawn(_worker, (2, free_port(), str(model), overrides, str(out), checkpoints))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)


def _torch_answers(model: Path, config: dict) -> dict[str, Any]:
    """The torch backend's answers on the same model and batch."""
    from runtime.devices import Device
    from runtime.train.torch_backend import TorchTrainBackend

    torch.set_num_threads(1)
    backend = TorchTrainBackend(str(model), _config(**config), device=Device.detect(), need_ref=True)
    batch = backend.compute_log_probs(_batch())
    metrics = backend.train_step(batch)
    return {
        "old": batch.old_log_probs,
        "ref": batch.ref_log_probs,
        "metrics": metrics,
        "weights": backend.named_weights(),
    }


@pytest.fixture(scope="module")
def reference(tiny: Path) -> dict[str, Any]:
    return _torch_answers(tiny, {})


@pytest.fixture(scope="module")
def dynamic_reference(tiny: Path) -> dict[str, Any]:
    return _torch_answers(tiny, DYNAMIC)


def _assert_matches(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert float((got["old"] - want["old"]).abs().max()) < TOLERANCE["log_probs"]
    assert float((got["ref"] - want["ref"]).abs().max()) < TOLERANCE["log_probs"]
    assert set(got["metrics"]) == set(want["metrics"])
    for name, value in want["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, abs=TOLERANCE["metrics"], rel=1e-4), name
    assert got["weights"].keys() == want["weights"].keys()
    worst = max(float((got["weights"][k] - want["weights"][k]).abs().max()) for k in want["weights"])
    assert worst < TOLERANCE["weights"], worst


# TP=2 (packed) is test_checkpoint_round_trip_and_load_flags's `tp2`, whose world answers the same before it
# checkpoints: one world instead of two
@pytest.mark.parametrize(
    "layout",
    [
        {"resource": {"actor": [1, 2], "rollout": [1, 2]}},  # DP=2
        {"pipeline-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        {
            "overlap-grad-reduce": True,
            "overlap-param-gather": True,
            "sequence-parallel": True,
            "tensor-model-parallel-size": 2,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
        {
            "overlap-grad-reduce": True,
            "overlap-param-gather": True,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
        {"balance-data": True, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        # CP=2 (Relax's rule wants --calculate-per-token-loss with it; this test's TrainConfig is _config's)
        {
            "context-parallel-size": 2,
            "calculate-per-token-loss": True,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
        # the cases above pack each micro-batch's sequences (`thd`, Relax's default); these pad rows
        {**BSHD, "tensor-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        {
            **BSHD,
            "context-parallel-size": 2,
            "calculate-per-token-loss": True,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
    ],
    ids=[
        "dp2",
        "pp2",
        "tp2-sp-overlap",
        "dp2-overlap",
        "dp2-balance-data",
        "cp2",
        "tp2-bshd",
        "cp2-bshd",
    ],
)
def test_two_ranks_match_the_torch_backend(tiny: Path, reference: dict, tmp_path: Path, layout: dict) -> None:
    got = _spawn(tiny, tmp_path, layout)
    _assert_matches(got, reference)
    _assert_checksum(got)


def _assert_checksum(got: dict[str, Any]) -> None:
    assert got["checksum"] == pytest.approx(
        float(sum(t.double().abs().sum() for t in got["weights"].values()))
    )


@pytest.mark.parametrize(
    "layout",
    [
        {"context-parallel-size": 2, "calculate-per-token-loss": True},
    ],
    ids=["cp2"],
)
def test_the_cuda_paths_traced_on_cpu_match_the_torch_backend(
    tiny: Path, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: dict
) -> None:
    """What CUDA runs, forced on here: RoPE's rows precomputed (`kernels.precompute_rope`: each token's rotary
    row from its position in its sequence, this rank's chunks of it under CP, packed or padded) and every
    TransformerLayer torch.compile'd, traced by dynamo and AOT autograd (`aot_eager`: the graphs inductor
    would compile on CUDA, packed-sequence parameters included, run eagerly)."""
    monkeypatch.setenv("RELAX_ROPE_PRECOMPUTE", "1")  # inherited by the spawned ranks
    monkeypatch.setenv("RELAX_KERNELS_COMPILE_BACKEND", "aot_eager")
    got = _spawn(tiny, tmp_path, {**layout, "resource": {"actor": [1, 2], "rollout": [1, 2]}})
    _assert_matches(got, reference)
    assert got["compiled_layers"] == 2  # the tiny model's layers


@pytest.mark.parametrize(
    "layout",
    [
        {"resource": {"actor": [1, 2], "rollout": [1, 2]}},  # DP=2: each rank its own micro-batch count
        {"pipeline-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        # CP=2: micro-batches of 2 x 24 tokens (max-tokens-per-gpu x CP, as Relax), each rank half of them
        {
            "context-parallel-size": 2,
            "calculate-per-token-loss": True,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
    ],
    ids=["dp2", "pp2", "cp2"],
)
def test_dynamic_batches_and_per_token_loss_match_the_torch_backend(
    tiny: Path, dynamic_reference: dict, tmp_path: Path, layout: dict
) -> None:
    got = _spawn(tiny, tmp_path, {**layout, "config": DYNAMIC})
    _assert_matches(got, dynamic_reference)


def test_packed_micro_batches_hold_the_rows_end_to_end() -> None:
    """`qkv_format` thd (Relax's default): a micro-batch's rows become one pack of their real tokens (each padded to a multiple of 2 x cp,
    then a padding sequence up to the schedule's length), positions restart per sequence, and per-position
    outputs map back onto the rows as the padded (`bshd`) form maps them: column j is what position j - 1
    predicted, 0 in column 0 and past a row's end. (Both forms train as the torch backend does:
    test_checkpoint_round_trip_and_load_flags `tp2` / test_two_ranks_match_the_torch_backend `tp2-bshd`, and
    the latter's `cp2` / `cp2-bshd`.)"""
    from runtime.train.megatron.backend import packed_length, packed_micro, padded_micro

    batch = _batch(3)
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    assert lengths == [8, 10, 12] and batch.tokens.shape[1] == 12
    packed = packed_micro(batch, 4, 8, total=40)  # CP=2: sequences of multiples of 4, the pack one of 8
    assert packed.seqlens == [8, 12, 12, 8] and packed.tokens.shape == (1, 40)
    assert packed_length(batch, 4, 8) == 32
    assert packed.positions[0].tolist() == [*range(8), *range(12), *range(12), *range(8)]
    for row, (start, n) in enumerate(zip([0, 8, 20], lengths, strict=True)):
        assert packed.tokens[0, start : start + n].tolist() == batch.tokens[row, :n].tolist()
        assert packed.targets[0, start : start + n - 1].tolist() == batch.tokens[row, 1:n].tolist()
        assert packed.targets[0, start + n - 1] == 0  # a sequence's last position predicts nothing
    padded = padded_micro(batch, 3, 12)

    # the same per-token "log-prob" under both forms: a function of the (prefix, next token) pair
    def per_position(micro):
        return (micro.tokens * 1000 + micro.targets).t().float()  # [s, b]

    got, want = packed.unpack(per_position(packed)), padded.unpack(per_position(padded))
    valid = batch.attention_mask.bool() & (torch.arange(12) > 0)
    assert torch.equal(got[valid], want[valid]) and not got[~valid].any()
    columns = torch.cat([packed.columns(2, 0), packed.columns(2, 1)])
    assert sorted(columns.tolist()) == list(range(40))  # the CP ranks hold the pack between them


def test_the_loss_head_reads_only_the_positions_that_carry_loss() -> None:
    """`_Micro.at_loss_positions` picks, from per-position values [s, b, h], exactly the positions whose
    predicted token `loss_mask` marks (a prompt's positions carry none), with those tokens as targets; and
    `spread` puts their results where `unpack` would, 0 elsewhere: packed (CP-padded sequences and a trailing
    padding sequence) and padded alike."""
    from runtime.train.megatron.backend import packed_micro, padded_micro

    batch = _batch(3)
    batch.loss_mask[1, -3] = 0  # a masked token inside a response
    for micro in (packed_micro(batch, 4, 8, total=40), padded_micro(batch, 4, 13)):
        code = (micro.tokens * 1000 + micro.targets).t().float()  # [s, b]: a function of (token, next)
        hidden = torch.stack([code, -code], dim=-1)  # [s, b, 2]
        states, targets, places = micro.at_loss_positions(hidden)
        assert states.shape == (int(batch.loss_mask.sum()), 2) and torch.equal(states[:, 1], -states[:, 0])
        assert torch.equal(states[:, 0].long() % 1000, targets)
        got = micro.spread(states[:, 0], places)
        want = micro.unpack(code) * (batch.loss_mask > 0)
        assert got.shape == batch.tokens.shape and torch.equal(got, want)
        assert torch.equal(got != 0, batch.loss_mask > 0)  # every loss token, and nothing else


def test_balance_data_balances_the_data_parallel_shares() -> None:
    """`balance_data`: equal-size shares (as without it) whose token counts are even; the backend's
    data-parallel shares follow it (`dp2-balance-data` above: the same update as one rank)."""
    from runtime.train.megatron.backend import balanced_rows

    tokens = torch.tensor([90, 10, 80, 20, 70, 30, 5, 95])
    parts = balanced_rows(tokens, [4, 4])
    assert sorted(torch.cat(parts).tolist()) == list(range(8))
    assert [len(p) for p in parts] == [4, 4]
    loads = [int(tokens[p].sum()) for p in parts]
    assert abs(loads[0] - loads[1]) <= 10
    skewed = torch.tensor([100, 100, 100, 100, 1, 1, 1, 1, 1])
    parts = balanced_rows(skewed, [5, 4])
    loads = [int(skewed[p].sum()) for p in parts]
    assert [len(p) for p in parts] == [5, 4] and max(loads) - min(loads) <= 3  # contiguous: 401 vs 4
    assert all(p.tolist() == sorted(p.tolist()) for p in parts)  # batch order inside each share


@pytest.mark.parametrize(
    "parallel",
    [
        {"tensor-model-parallel-size": 2},
        {"context-parallel-size": 2, "calculate-per-token-loss": True},  # replicas over the CP ranks
    ],
    ids=["tp2", "cp2"],
)
def test_checkpoint_round_trip_and_load_flags(
    tiny: Path, reference: dict, tmp_path: Path, parallel: dict
) -> None:
    """Before it checkpoints, the world answers as the torch backend does (under TP=2 this is the comparison's
    only world: test_two_ranks_match_the_torch_backend leaves it to this test)."""
    layout = {**parallel, "resource": {"actor": [1, 2], "rollout": [1, 2]}}
    got = _spawn(tiny, tmp_path, layout, checkpoints=True)
    _assert_matches(got, reference)
    _assert_checksum(got)
    folder = tmp_path / "ckpt" / "iter_0000000"
    assert got["record"] == str(folder)
    assert (
        tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    ).read_text().strip() == "1"  # the last save
    assert (folder / ".metadata").is_file() and (folder / ".relax-job").is_file()
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["optimizer_steps"] == 2 and state["extra"] == {"data": {"position": 7}}
    assert got["iteration"] == 0 and got["extra"] == {"data": {"position": 7}} and got["steps"] == 2

    def worst(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    assert worst(got["moved"], got["saved"]) > 1e-4  # the extra step moved the weights
    assert worst(got["loaded"], got["saved"]) == 0.0  # loading brought them back exactly
    assert got["finetune"] is None  # finetune: weights only, the run starts at rollout 0
    assert worst(got["after_finetune"], got["saved"]) == 0.0
    assert worst(got["loaded_without_optimizer"], got["saved"]) == 0.0
    assert worst(got["from_ref_load"], got["saved"]) == 0.0  # iteration 1 holds the same weights
    state = json.loads((tmp_path / "ckpt" / "iter_0000001" / "trainer_state.json").read_text())
    assert state["has_optimizer"] is False and got["without_optimizer"][0] == 1
    exported = tmp_path / "hf"
    assert (exported / "model.safetensors").is_file() and (exported / "config.json").is_file()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no scratch folder left behind


def test_torch_fused_adam_matches_and_survives_a_checkpoint_round_trip(
    tiny: Path, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TE or Apex megatron takes torch's Adam; the backend switches it to torch's fused kernel (on CUDA
    by default; `RELAX_FUSED_ADAM=1` here, on the CPU, the same path). The same answers as the torch backend,
    and a checkpoint saved and loaded keeps it fused with its step counts on the parameters' device."""
    monkeypatch.setenv("RELAX_FUSED_ADAM", "1")  # the spawned ranks inherit it
    got = _spawn(tiny, tmp_path, {"resource": {"actor": [1, 2], "rollout": [1, 2]}}, checkpoints=True)
    assert got["fused_adam"] == 1 and got["fused_after_load"] == 1 and got["steps_on_device"]
    _assert_matches(got, reference)
    assert max(float((got["loaded"][k] - got["saved"][k]).abs().max()) for k in got["saved"]) == 0.0


# -- precision: fp16 with dynamic loss scaling, and the optimizer offloaded to the CPU -----------------------------
# One spawn (DP=2, the distributed optimizer sharded over both ranks) builds one backend after another, each
# trained STEPS passes over the same batch: fp32 (what fp16 is compared with), fp16 at a loss scale that fits,
# fp16 from a loss scale that overflows, bf16 (what the offload is compared with) and bf16 with the optimizer
# offloaded (all of it, and half of it with the overlapped copies).
STEPS = 3
DP2 = {"resource": {"actor": [1, 2], "rollout": [1, 2]}}
PRECISION_RUNS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"fp16": True, "initial-loss-scale": 4096},
    # one optimizer step per pass; every overflow halves the scale (hysteresis 1) and skips the step
    "fp16_overflow": {
        "fp16": True,
        "initial-loss-scale": 2.0**40,
        "hysteresis": 1,
        "config": {"global_batch_size": 8},
    },
    # what the overflowing run's first update must equal: the same step from a scale that fits
    "fp16_fits": {"fp16": True, "initial-loss-scale": 4096, "config": {"global_batch_size": 8}},
    "bf16": {"bf16": True},
    "bf16_offload": {"bf16": True, "optimizer-cpu-offload": True, "use-precision-aware-optimizer": True},
    "bf16_offload_half": {
        "bf16": True,
        "optimizer-cpu-offload": True,
        "use-precision-aware-optimizer": True,
        "optimizer-offload-fraction": 0.5,
        "overlap-cpu-optimizer-d2h-h2d": True,
    },
}


def _precision_worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    import dataclasses

    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class
    from runtime.train.megatron.parallel import destroy_parallel

    results: dict[str, Any] = {}
    for name, overrides in PRECISION_RUNS.items():
        overrides = {**DP2, **overrides}
        config = dataclasses.replace(_config(), **overrides.pop("config", {}))
        bf16 = overrides.pop("bf16", False)
        values = _values(Path(model), **overrides)
        values["bf16"] = bf16
        backend = train_backend_class("megatron")(
            model,
            config,
            device=Device.detect(),
            need_ref=True,
            context=TrainContext(rank, world, "127.0.0.1", port, values),
        )
        batch = backend.compute_log_probs(_batch())
        run: dict[str, Any] = {"steps": [], "weights": [backend.named_weights()]}
        passes = {"fp16_overflow": 40, "fp16_fits": 1}.get(name, STEPS)
        for _ in range(passes):
            run["steps"].append(backend.train_step(batch))
            run["weights"].append(backend.named_weights())
            if name == "fp16_overflow" and math.isfinite(run["steps"][-1]["grad_norm"]):
                run["steps"].append(backend.train_step(batch))  # one more after the first update
                run["weights"].append(backend.named_weights())
                break
        distributed = getattr(backend.optimizer, "chained_optimizers", [backend.optimizer])
        run["optimizers"] = [
            (
                type(o.optimizer).__name__,
                len(getattr(o.optimizer, "cpu_optimizers", [])),
                bool(getattr(o.optimizer, "gpu_optimizer", None)),
            )
            for o in distributed
        ]
        # the fp32 main parameters (bf16 runs): each rank's shards, from the distributed optimizer or, offloaded,
        # from the hybrid optimizer's host copies
        main: list[torch.Tensor] = []
        for o in distributed:
            hybrid = getattr(o.optimizer, "param_to_fp32_param", None)
            if hybrid is not None:
                main += [hybrid[p] for group in o.shard_float16_groups for p in group]
            else:
                main += [p for group in o.shard_fp32_from_float16_groups for p in group]
        shards: list[Any] = [None] * world
        dist.all_gather_object(
            shards, torch.cat([p.detach().float().flatten() for p in main]) if main else None
        )
        run["main_params"] = shards
        results[name] = run
        if name == "bf16":
            results["checkpoints"] = _async_saves_with_retention(backend, batch, Path(out).parent, model)
        destroy_parallel(process_group=False)
    if rank == 0:
        torch.save(results, out)


def _async_saves_with_retention(backend: Any, batch: Any, root: Path, model: str) -> dict[str, Any]:
    """The pipeline's `CheckpointManager` over this rank's backend (what `TrainGroup` forwards every call to,
    rank 0's answer coming back): `async-save` with `max-actor-ckpt-to-keep` 2, a save after each of four
    steps; then the last one is loaded back and the next step retaken."""
    from runtime.reporter import LocalReporter
    from runtime.saving import CheckpointManager
    from runtime.spec import load_spec
    from runtime.train.checkpoint import list_iterations

    save = root / "async-ckpt"
    spec = load_spec(
        {
            "train-backend": "megatron",
            "hf-checkpoint": model,
            "prompt-data": "unused.jsonl",
            "rollout-batch-size": 4,
            "num-rollout": 4,
            "rm-type": "math",
            "colocate": True,
            "save": str(save),
            "save-interval": 1,
            "async-save": True,
            "max-actor-ckpt-to-keep": 2,
        }
    )
    manager = CheckpointManager(spec, LocalReporter(root / f"report-{dist.get_rank()}"), backend)  # type: ignore[arg-type]
    seen: list[dict[str, Any]] = []
    for rollout_id in range(4):
        backend.train_step(batch)
        manager.save(rollout_id, {"rollout_id": rollout_id})
        # while that save is (or was) being written: what is on disk, and a retention pass of its own
        seen.append({"listed": list_iterations(save), "writing": rollout_id not in list_iterations(save)})
        if dist.get_rank() == 0:
            manager._prune()
        dist.barrier()
    manager.collect(wait=True)
    manager.reporter.close()  # sends what is pending
    dist.barrier()
    saved = backend.named_weights()
    after_save = backend.train_step(batch)
    moved = backend.named_weights()
    resumed = backend.load_checkpoint(str(save))
    loaded = backend.named_weights()
    after_load = backend.train_step(batch)
    return {
        "seen": seen,
        "kept": list_iterations(save),
        "latest": (save / "latest_checkpointed_iteration.txt").read_text().strip(),
        "leftovers": sorted(p.name for p in save.iterdir() if p.name.startswith(".")),
        "resumed": resumed,
        "saved": saved,
        "moved": moved,
        "loaded": loaded,
        "after_save": after_save,
        "after_load": after_load,
        "reports": (root / "report-0" / "reports.jsonl").read_text() if dist.get_rank() == 0 else "",
        "retained": backend.named_weights(),
    }


@pytest.fixture(scope="module")
def precision_runs(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from runtime.train.megatron.parallel import free_port

    out = tmp_path_factory.mktemp("precision") / "runs.pt"
    ranks.spawn(_precision_worker, (2, free_port(), str(tiny), str(out)))
    return torch.load(out, weights_only=False)


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_fp16_with_dynamic_loss_scaling_tracks_fp32(precision_runs: dict[str, Any]) -> None:
    """`fp16` (Float16Module, megatron's fp16 optimizer with a dynamic loss scale, fp32 main params) against
    the same three passes in fp32. Tolerances: fp16 keeps 11 significant bits (unit roundoff 2**-11 = 4.9e-4);
    activations, weights and logits are rounded to it, so per-token log-probs of about -6 carry errors of a
    few 1e-3 that average out over the ~50 tokens of a loss: the losses agree within 5e-4 (measured: 5e-5)
    and the gradient norms, which are unscaled before they are reported, within 1e-3 relative (measured:
    6e-5), the check that the loss scale is taken out again. The weights agree within 2e-3 after one step
    (Adam moves every weight by about lr = 1e-3 whatever the gradient's size, so an fp16 rounding that flips
    the sign of a near-zero gradient moves that weight the other way; measured 2.1e-3 worst of ~60k weights
    after two optimizer steps, 2.9e-3 after six: the tolerance grows with the steps, 2 lr per step)."""
    fp32, fp16 = precision_runs["fp32"], precision_runs["fp16"]
    assert len(fp16["steps"]) == STEPS
    for want, got in zip(fp32["steps"], fp16["steps"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=5e-4)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3)
        assert got["loss_scale"] == 4096.0  # no overflow at this scale, and no window of 1000 steps grown
        assert "loss_scale" not in want  # the metric is fp16's
    assert _worst(fp16["weights"][0], fp32["weights"][0]) < 2**-11 * 0.1  # the fp16 copy of the same weights
    for i, (a, b) in enumerate(zip(fp16["weights"][1:], fp32["weights"][1:], strict=True)):
        steps = 2 * (i + 1)  # two optimizer steps per pass (global batch 4 of 8 samples)
        assert _worst(a, b) < 2 * 1e-3 * steps, i
    assert _worst(fp16["weights"][-1], fp16["weights"][0]) > 1e-3  # it trained


def test_fp16_overflow_skips_the_step_and_lowers_the_scale(precision_runs: dict[str, Any]) -> None:
    """From `initial-loss-scale` 2**40 the scaled gradients overflow fp16: each such step is skipped (weights
    bit for bit unchanged, grad_norm NaN) and, with `hysteresis` 1, halves the scale, until it fits; that
    first update is the one a run starting at a scale that fits makes (the skipped steps touched neither
    the weights nor Adam's state), and training goes on from there."""
    run, fits = precision_runs["fp16_overflow"], precision_runs["fp16_fits"]
    steps, weights = run["steps"], run["weights"]
    skipped = [s for s in steps if math.isnan(s["grad_norm"])]
    assert 5 <= len(skipped) <= 35 and steps[: len(skipped)] == skipped  # overflows first, then it fits
    for k, step in enumerate(skipped):
        assert step["loss_scale"] == 2.0 ** (40 - k - 1)
        assert _worst(weights[k + 1], weights[0]) == 0.0
    first = len(skipped)
    assert math.isfinite(steps[first]["grad_norm"]) and steps[first]["loss_scale"] == 2.0 ** (40 - first)
    assert steps[first]["grad_norm"] == pytest.approx(fits["steps"][0]["grad_norm"], rel=1e-6)
    assert _worst(weights[first + 1], fits["weights"][1]) == 0.0
    assert _worst(weights[first + 1], weights[0]) > 1e-4
    assert all(torch.isfinite(w.float()).all() for w in weights[-1].values())
    assert math.isfinite(steps[-1]["grad_norm"]) and _worst(weights[-1], weights[-2]) > 1e-4


def test_optimizer_cpu_offload_matches_without(precision_runs: dict[str, Any]) -> None:
    """`optimizer-cpu-offload` (with `use-precision-aware-optimizer`, which Megatron requires with it, and the
    distributed optimizer) runs megatron's HybridDeviceOptimizer: gradients copied to host buffers, a CPU
    AdamW on fp32 master copies, results copied back into the model's shards (on CPU, `cpu.py` lets it see
    the model's tensors as device tensors). Against the same bf16 run without it: the same losses and
    gradient norms within 1e-5 and the same fp32 main parameters within 1e-5 (measured: ~1e-7, torch's
    fused AdamW offloaded vs its for-loop one); the bf16 weights are those main parameters rounded, so they
    agree up to one bf16 rounding step. All of the optimizer offloaded (one CPU AdamW, no device one), and
    half of it (`optimizer-offload-fraction` 0.5) with the overlapped copies (`overlap-cpu-optimizer-d2h-h2d`:
    a device optimizer too, one CPU optimizer per parameter).
    (megatron-core 0.16 cannot offload fp32 parameters, on any device: its hybrid optimizer refuses the
    distributed optimizer's fp32 shards, views of the parameters; the megatron backend trains in bf16 or
    fp16 only, as Relax derives.)"""
    base = precision_runs["bf16"]
    assert base["optimizers"] == [("AdamW", 0, False)]
    for name, optimizers in (
        ("bf16_offload", [("HybridDeviceOptimizer", 1, False)]),
        ("bf16_offload_half", [("HybridDeviceOptimizer", 2, True)]),
    ):
        run = precision_runs[name]
        assert run["optimizers"] == optimizers, name
        for want, got in zip(base["steps"], run["steps"], strict=True):
            assert got["loss"] == pytest.approx(want["loss"], abs=1e-5), name
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], abs=1e-5), name
        for a, b in zip(run["main_params"], base["main_params"], strict=True):
            assert a.shape == b.shape and a.numel() > 0
            assert float((a - b).abs().max()) < 1e-5, name
        for a, b in zip(run["weights"], base["weights"], strict=True):
            assert _worst(a, b) <= max(float(w.float().abs().max()) for w in b.values()) * 2**-8, name
        assert _worst(run["weights"][-1], run["weights"][0]) > 1e-3, name  # it trained


def test_async_saves_rotate_and_resume_exactly(precision_runs: dict[str, Any]) -> None:
    """`async-save` with `max-actor-ckpt-to-keep` 2 on the megatron backend (DP=2), through the pipeline's
    CheckpointManager: the torch_dist checkpoints land in the background, retention keeps exactly the newest
    2 iterations and never touches the one being written (a retention pass run while it is in flight leaves
    it to land), and the last one loads back the weights, optimizer and RNG: the next step retaken from it
    is the step taken straight after the save, bit for bit."""
    got = precision_runs["checkpoints"]
    assert got["kept"] == [2, 3] and got["latest"] == "3"
    assert got["leftovers"] == []  # no scratch folder left behind
    for rollout_id, seen in enumerate(got["seen"]):  # at most the 2 kept and the one that just landed
        assert set(seen["listed"]) <= {rollout_id - 2, rollout_id - 1, rollout_id}, (rollout_id, seen)
    assert got["resumed"][0] == 3 and got["resumed"][1] == {"rollout_id": 3}
    assert _worst(got["moved"], got["saved"]) > 1e-4
    assert _worst(got["loaded"], got["saved"]) == 0.0
    assert got["after_load"] == got["after_save"]  # the same losses, grad norm (optimizer state, RNG)
    assert _worst(got["retained"], got["moved"]) == 0.0
    reports = [json.loads(line) for line in got["reports"].splitlines()]
    registered = sorted(c["step"] for r in reports for c in r["checkpoints"])
    assert registered == [0, 1, 2, 3]  # every background save registered once it landed
    removed = [e["message"] for r in reports for e in r["events"] if e["kind"] == "checkpoint_removed"]
    assert sorted(Path(m).name for m in removed) == ["iter_0000000", "iter_0000001"], removed


def test_fp16_and_cpu_offload_jobs_pass_the_capability_check(tiny: Path) -> None:
    """What the tests above train is what a job spec may ask for: with `fp16` Relax derives
    `store-param-remainders` off, and `optimizer-cpu-offload` needs `use-precision-aware-optimizer`; the
    megatron backend accepts both (and refuses the precision-aware optimizer without the offload, which would
    need TransformerEngine's FusedAdam)."""
    from jobspec.spec import FIELDS
    from runtime.capabilities import unsupported_parameters

    defaults = {name: field.default for name, field in FIELDS.items()}
    for name in ("fp16", "fp16_overflow", "bf16_offload", "bf16_offload_half"):
        overrides = {k: v for k, v in PRECISION_RUNS[name].items() if k not in ("config", "bf16")}
        values = _values(tiny, **overrides)
        values["bf16"] = not values["fp16"]  # as Relax derives it
        assert unsupported_parameters(values, defaults) == [], name
    values = _values(tiny, **{"use-precision-aware-optimizer": True})
    assert unsupported_parameters(values, defaults) == ["use_precision_aware_optimizer=True"]
