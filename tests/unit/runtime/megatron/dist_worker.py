"""One rank of a multi-process megatron test (`run`, forked by the conftest's `run_ranks`; also a script:
argv rank world_size master_port job.json; not collected). The job names a Hugging Face folder, a layout, a
token batch and a number of steps; the rank loads the HF weights sharded, gathers them back (checks they equal the folder's),
trains with megatron's schedule, DDP and optimizer (fp32 Adam, no weight decay), and writes
`<out>/rank<r>.json` with the per-step losses (last pipeline stage) and timings.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))


def main() -> None:
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])


def run(rank: int, world: int, port: int, job_path: str) -> None:
    """One rank (the conftest's `run_ranks` forks it from the warm server, tests/unit/runtime/ranks.py)."""
    job = json.loads(Path(job_path).read_text())
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from runtime.train.megatron import convert
    from runtime.train.megatron.model import build_model, model_args_for, transformer_config
    from runtime.train.megatron.parallel import (
        ParallelLayout,
        cp_columns,
        destroy_parallel,
        init_process_group,
        initialize_parallel,
    )

    torch.set_num_threads(1)
    layout = ParallelLayout(**job["layout"], world_size=world)
    init_process_group(rank, world, "127.0.0.1", port, timeout_minutes=2)
    initialize_parallel(layout, seed=1234)
    folder = Path(job["hf"])
    values = {"hidden_dropout": 0.0, "attention_dropout": 0.0, **job.get("values", {})}
    args = model_args_for(values, folder)  # as the backend does: the spec's flags over config.json
    config = transformer_config(args, layout, values=values)
    models = build_model(args, layout, config)
    convert.load_hf_checkpoint(models, folder, args, layout)
    gathered = convert.gather_hf_state(models, args, layout, dst=0)
    result: dict = {"rank": rank, "setup_s": round(time.perf_counter() - t0, 2)}
    # which routed-experts module ran and whether megatron's permute-fusion path was on (MoE cases check them)
    result["experts"] = sorted(
        {type(m).__name__ for g in models for n, m in g.named_modules() if n.endswith(".experts")}
    )
    result["permute_fusion"] = bool(getattr(config, "moe_permute_fusion", False))
    disk = convert.SafetensorsFolder(folder)
    stage = convert.stage_hf_state(models, args, layout)  # this rank's pipeline stage, every TP/EP shard
    result["stage_equal"] = bool(stage) and all(torch.equal(v, disk[k].to(v.dtype)) for k, v in stage.items())
    if gathered is not None:
        result["gathered_equal"] = set(gathered) == set(disk) and all(
            torch.equal(gathered[k], disk[k].to(gathered[k].dtype)) for k in disk
        )

    bf16 = bool(values.get("bf16"))
    if bf16:  # bf16 parameters behind megatron's Float16Module, fp32 main parameters in the optimizer
        from megatron.core.transformer.module import Float16Module

        models = [Float16Module(config, m) for m in models]
    dist_opt = bool(job.get("distributed_optimizer", True))
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=dist_opt
    )
    models = [
        DistributedDataParallel(config, ddp_config, module=m, disable_bucketing=i > 0)
        for i, m in enumerate(models)
    ]
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=job["lr"],
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_eps=1e-8,
        clip_grad=job.get("clip_grad", 0.0),
        bf16=bf16,
        fp16=False,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=dist_opt,
    )
    optimizer = get_megatron_optimizer(opt_config, models)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [m.no_sync for m in models] if len(models) > 1 else models[0].no_sync

    tokens = torch.load(job["batch"])  # [global batch, seq + 1]
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = tokens.chunk(dp)[dp_rank]
    seq = mine.shape[1] - 1
    packed = bool(job.get("packed"))
    # packed: one micro-batch per rank holding all its sequences as `thd` ([1, n * seq] with cu_seqlens)
    micro = [mine] if packed else [mine[i : i + 1] for i in range(mine.shape[0])]
    tokens_per_micro = mine.shape[0] * seq if packed else seq

    cp, cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        ids, labels = batch[:, :-1], batch[:, 1:]
        positions = torch.arange(seq).repeat(ids.shape[0], 1)
        extra = {}
        if cp > 1:  # this CP rank's two chunks of every sequence (labels taken before the split)
            columns = cp_columns(seq, cp, cp_rank)
            ids, labels, positions = ids[:, columns], labels[:, columns], positions[:, columns]
        if packed:
            n = ids.shape[0]
            cu = torch.arange(0, (n + 1) * seq, seq, dtype=torch.int32)
            extra["packed_seq_params"] = PackedSeqParams(
                qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=seq, max_seqlen_kv=seq
            )
            ids, labels, positions = (x.reshape(1, -1) for x in (ids, labels, positions))
        per_token = model(ids, positions, None, labels=labels, **extra)  # [b, s] (vocab-parallel CE)

        def loss_func(output):
            if cp == 1:
                loss = output.float().mean()
                return loss, {"loss": loss.detach()}
            # as Megatron-LM: this rank's token losses over the whole sequences' count (the CP ranks' gradients
            # add up to the mean's); the schedule multiplies by the CP size, which DDP's average divides out
            count = output.numel() * cp
            loss = output.float().sum() / count
            whole = loss.detach().clone()
            dist.all_reduce(whole, group=ps.get_context_parallel_group())
            # divided by the micro-batch count, as the schedule's in-place division does to `loss.detach()`
            return loss, {"loss": whole / len(micro)}

        return per_token, loss_func

    fwd_bwd = get_forward_backward_func()
    losses, step_s, grad_norms = [], [], []
    for _ in range(job["steps"]):
        t = time.perf_counter()
        optimizer.zero_grad()
        for m in models:
            m.zero_grad_buffer()
        iterators = [iter(micro) for _ in models]
        out = fwd_bwd(
            forward_step_func=forward_step,
            data_iterator=iterators if len(models) > 1 else iterators[0],
            model=models if len(models) > 1 else models[0],
            num_microbatches=len(micro),
            seq_length=tokens_per_micro,
            micro_batch_size=1,
            forward_only=False,
        )
        ok, grad_norm, _ = optimizer.step()
        assert ok, "optimizer step skipped"
        grad_norms.append(None if grad_norm is None else float(grad_norm))
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            # the schedule divides what loss_func reports by the number of micro-batches: the sum is the mean
            loss = torch.stack([o["loss"] for o in out]).sum()
            dist.all_reduce(loss, group=ps.get_data_parallel_group())
            losses.append(loss.item() / dp)
        step_s.append(round(time.perf_counter() - t, 3))
    result["losses"] = losses if ps.is_pipeline_last_stage(ignore_virtual=True) else None
    result["step_s"] = step_s
    result["grad_norms"] = grad_norms
    result["total_s"] = round(time.perf_counter() - t0, 2)
    Path(job["out"], f"rank{rank}.json").write_text(json.dumps(result))
    destroy_parallel()


if __name__ == "__main__":
    main()
