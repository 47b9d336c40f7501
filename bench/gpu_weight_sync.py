"""The collective weight sync (runtime/weight_sync/collective.py, ADR 0014) beside the object store: the
trainer's weights to rollout engines on GPUs of their own, one table.

    python -m bench.gpu_weight_sync                     # Qwen2-0.5B shape, 2 engines, nccl 64MiB,512MiB,1GiB + object_store
    python -m bench.gpu_weight_sync --engines 3 --json /tmp/weight_sync.json    # every GPU of a 4-GPU host
    python -m bench.gpu_weight_sync --model tiny --engines 2 --buckets 1MiB --repeats 1   # anywhere (CPU: gloo)

A private local Ray (loopback only, token auth with a token of this run, as the tests' and the embedded
platform's) with one trainer actor (`TrainActor`, the torch backend) and `--engines` fastgen engine actors
(`RolloutEngineActor`, `RELAX_ROLLOUT_BACKEND=fastgen`), each on a GPU of its own where the machine has GPUs
(the trainer and the engines need `--engines` + 1: NCCL cannot put two ranks on one GPU), on CPU otherwise
(the collective then runs over gloo: the same code). The model is a random-initialised Qwen2 of
`bench.gpu_rollout`'s shapes (`qwen2-0.5b`: vocab 151,936, 24 layers, hidden 896, tied embeddings; `tiny`),
built once from its config (no hub) and saved as bf16 safetensors in a temporary folder that every actor
loads. The torch backend trains in fp32; `--trainer-dtype bf16` (the default) casts its copy to bf16 so the
pushes carry what a bf16 trainer (megatron on GPU) gathers: the model's bf16 bytes.

Rows: for each backend of `--backends`, `nccl` (`CollectiveWeightSync`, one row per bucket size of
`--buckets`, each with a group of its own: the first push forms it, NCCL's communicators included) and
`object_store` (`ObjectStoreWeightSync`: no buckets, one row), the trainer's weights are first moved by seeded
noise (so a push visibly changes the engines), then pushed once untimed and `--repeats` times timed, with
increasing versions. After the last push one engine (row i checks engine i mod N) must hold exactly the
trainer's weights: `torch.equal` in the engine's dtype (bf16 on GPU, fp32 on CPU) against the trainer's
tensors converted to it, which is exact (both conversions round to nearest even); that engine must have
differed before the row (else the check proves nothing), and every engine must hold the row's last version.

The first line gives the bytes pushed (the trainer's tensors as gathered, the tied lm_head once). Columns:
the transport, bucket size and count, the first push (group formation and NCCL setup included), the steady push (mean of the timed ones, the driver's
wall clock from the call to every engine done), GB/s of pushed bytes per engine (each engine gets all of
them; 1 GB = 1e9 bytes), and for the collective rank 0's own split (`CollectiveWeightSync.last_push_timings`,
means over the timed pushes): gather (`named_weights`: device to host), wait (until every engine is ready),
H2D (each bucket copied to the trainer's GPU, packed), broadcast (until every engine has taken each bucket,
the engines' applying of the bucket before included). What the split leaves out of the steady push is the
driver's calls (the metadata to each engine) and the engines applying the last bucket.

No step waits forever: every Ray call has a timeout (`--push-timeout` for a push), and a watchdog ends the
run with exit status 124 and every thread's stack after `--deadline` seconds. A failed check or push stops
the run (the table so far is printed, and written to `--json`) with exit status 1.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODELS = ("qwen2-0.5b", "tiny")
BACKENDS = ("nccl", "object_store")
UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
READY_TIMEOUT_S = 600.0  # an actor's start (model load, CUDA init) or one check

_phase = ["start"]  # what the run is doing, for the watchdog's message


class BenchFailure(RuntimeError):
    """A check or a push failed: the run stops with exit status 1."""


# ------------------------------------------------------------------------------------------------ arguments


def parse_size(text: str, flag: str = "--buckets") -> int:
    """'64MiB' -> 67108864 (B, KiB, MiB, GiB, KB, MB, GB; a bare number is bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in UNITS:
        raise argparse.ArgumentTypeError(
            f"{flag}: {text!r} is not a size (a number with B, KiB, MiB, GiB, KB, MB or GB: '64MiB')"
        )
    size = int(float(match.group(1)) * UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"{flag}: {text!r} is less than 1 byte")
    return size


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engines", type=int, default=2, help="rollout engine actors, a GPU each (default 2)")
    p.add_argument(
        "--buckets",
        default="64MiB,512MiB,1GiB",
        help="comma list of --update-weight-buffer-size values for the nccl rows (default 64MiB,512MiB,1GiB)",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed pushes per row, after one untimed (default 3)"
    )
    p.add_argument("--model", choices=MODELS, default="qwen2-0.5b")
    p.add_argument("--backends", default="nccl,object_store", help="comma list of: " + ",".join(BACKENDS))
    p.add_argument(
        "--trainer-dtype",
        choices=("bf16", "fp32"),
        default="bf16",
        help="what the trainer gathers and pushes (default bf16, as megatron on GPU; fp32: the torch backend's own)",
    )
    p.add_argument(
        "--push-timeout", type=float, default=180.0, help="seconds one push may take (default 180)"
    )
    p.add_argument(
        "--deadline", type=float, default=570.0, help="seconds the whole run may take (default 570)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows, checks and setup here")
    args = p.parse_args(argv)
    try:
        args.bucket_sizes = [parse_size(b) for b in args.buckets.split(",") if b.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backend_list if b not in BACKENDS]
    if unknown or not args.backend_list:
        p.error(f"--backends: {unknown or args.backends!r} not among {', '.join(BACKENDS)}")
    if "nccl" in args.backend_list and not args.bucket_sizes:
        p.error("--buckets: give at least one size for the nccl rows (e.g. 512MiB)")
    if args.engines < 1:
        p.error(f"--engines: {args.engines} (at least 1)")
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats} (at least 1)")
    if args.push_timeout <= 0 or args.deadline <= 0:
        p.error("--push-timeout and --deadline must be positive seconds")
    return args


# ---------------------------------------------------------------------------------------------- the setup


@dataclass
class Report:
    """What the run found so far: printed, and written to `--json`, at its end or at the watchdog's."""

    json_path: str | None
    began: float = field(default_factory=time.perf_counter)
    setup: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)  # folders removed at the end (the watchdog's too)

    def remove_scratch(self) -> None:
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)

    def emit(self) -> None:
        print()
        print("\n".join(table(self.rows)), flush=True)
        print(
            "check: after each row's last push, one engine's weights equal the trainer's exactly (torch.equal "
            f"in the engine's dtype); {len(self.rows)} row(s), {time.perf_counter() - self.began:.0f} s in all"
        )
        for failure in self.failures:
            print(f"FAILED: {failure}", file=sys.stderr, flush=True)
        if self.json_path:
            out = {
                "setup": self.setup,
                "rows": [asdict(r) for r in self.rows],
                "failures": self.failures,
                "ok": not self.failures,
            }
            Path(self.json_path).write_text(json.dumps(out, indent=2, default=str) + "\n")
            print(f"wrote {self.json_path}", flush=True)


def start_watchdog(deadline_s: float, report: Report) -> threading.Timer:
    """After `deadline_s`: report what was measured, say what the run was doing, dump every thread's stack,
    exit 124 (Ray's processes, which share this one's fate, go with it)."""

    def expire() -> None:
        report.failures.append(f"over --deadline {deadline_s:.0f} s while {_phase[0]}")
        report.emit()
        report.remove_scratch()
        print("stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(124)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def ray_environment() -> Path | None:
    """The environment of a private local Ray, set before anything imports ray (it reads its auth mode
    then): loopback only (single-machine mode), token auth with a token of this run unless the environment
    chose an auth mode, no usage stats, no metrics servers. Returns the token's folder."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    token_dir = None
    if "RAY_AUTH_MODE" not in os.environ:
        token_dir = Path(tempfile.mkdtemp(prefix="relax-bench-ray-"))  # 0700
        token = token_dir / "auth_token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would override the file
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    return token_dir


def start_ray(num_cpus: int) -> None:
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)


def build_model_folder(model: str, folder: Path, seed: int) -> dict[str, Any]:
    """The model from its config only (random init), saved as bf16 safetensors; returns its facts."""
    import torch

    from bench.gpu_rollout import build_model

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    hf = build_model(model == "tiny", torch.device("cpu"), torch.bfloat16, seed)
    hf.save_pretrained(str(folder), safe_serialization=True)
    files = sorted(folder.glob("*.safetensors"))
    return {
        "params": sum(p.numel() for p in hf.parameters()),  # the tied embedding once
        "vocab": hf.config.vocab_size,
        "layers": hf.config.num_hidden_layers,
        "hidden": hf.config.hidden_size,
        "safetensors_bytes": sum(f.stat().st_size for f in files),
    }


@dataclass
class Actors:
    trainer: Any
    engines: list[Any]
    train: Any  # TrainGroup
    rollout: Any  # RolloutGroup
    transport: str  # what the collective runs over: nccl | gloo
    device: dict[str, Any] = field(default_factory=dict)


def start_actors(folder: Path, engines: int, trainer_dtype: str) -> Actors:
    import ray

    from runtime.roles.actors import RolloutEngineActor, TrainActor
    from runtime.roles.groups import RolloutGroup, TrainGroup
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig

    gpus = int(ray.cluster_resources().get("GPU", 0))
    if 0 < gpus < engines + 1:
        raise BenchFailure(
            f"--engines {engines}: the trainer and each engine need a GPU of their own ({engines + 1}), "
            f"this machine has {gpus} (NCCL cannot put two ranks on one GPU): use --engines {gpus - 1}"
        )
    one = {"num_gpus": 1} if gpus else {}
    trainer = (
        ray.remote(TrainActor)
        .options(num_cpus=0, **one)
        .remote(
            "torch",
            str(folder),
            TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=1e-3)),
            need_ref=False,
        )
    )
    fastgen = {"env_vars": {"RELAX_ROLLOUT_BACKEND": "fastgen"}}
    actors = [
        ray.remote(RolloutEngineActor)
        .options(num_cpus=0, runtime_env=fastgen, **one)
        .remote(str(folder), engine_index=i, max_batch_size=8)
        for i in range(engines)
    ]
    ray.get([a.ready.remote() for a in [trainer, *actors]], timeout=READY_TIMEOUT_S)

    def setup(actor: Any, dtype: str) -> dict[str, Any]:  # in the trainer
        import torch

        if dtype == "bf16":
            actor.backend.model.to(torch.bfloat16)  # what a bf16 trainer gathers (no training here)
        info: dict[str, Any] = {"cuda": torch.cuda.is_available(), "torch": torch.__version__}
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["cuda_version"] = torch.version.cuda
        return info

    info = ray.get(trainer.__ray_call__.remote(setup, trainer_dtype), timeout=READY_TIMEOUT_S)
    kinds = ray.get(
        [a.__ray_call__.remote(lambda actor: type(actor.engine).__name__) for a in actors],
        timeout=READY_TIMEOUT_S,
    )
    if any(kind != "FastGenEngine" for kind in kinds):
        raise BenchFailure(f"the engines are {kinds}, expected FastGenEngine (RELAX_ROLLOUT_BACKEND=fastgen)")
    info["gpus_in_ray"] = gpus
    return Actors(
        trainer, actors, TrainGroup([trainer]), RolloutGroup(actors), "nccl" if gpus else "gloo", info
    )


# ------------------------------------------------------------------------------------------- the checks


def perturb(actors: Actors, seed: int) -> Any:
    """Move every trainer weight by seeded noise (what a training step does); returns a reference to the
    trainer's tensors as it pushes them (`named_weights`)."""
    import ray

    def move(actor: Any, seed: int) -> None:  # in the trainer
        import torch

        with torch.no_grad():
            for index, p in enumerate(actor.backend.model.parameters()):
                gen = torch.Generator(device=p.device).manual_seed(seed * 1000 + index)
                noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                p.add_((0.01 * noise).to(p.dtype))

    ray.get(actors.trainer.__ray_call__.remote(move, seed), timeout=READY_TIMEOUT_S)
    return actors.trainer.named_weights.remote()


def compare(engine: Any, theirs_ref: Any) -> dict[str, Any]:
    """In the engine's process: its weights against the trainer's, in the engine's dtype (exact)."""
    import ray

    def check(actor: Any, theirs: dict[str, Any]) -> dict[str, Any]:  # in the engine
        import torch

        weights = actor.engine.weights  # fastgen's flat buffer
        differ: list[str] = []
        worst = 0.0
        for name, tensor in theirs.items():
            mine = weights.target(name)
            want = tensor.to(device=mine.device, dtype=mine.dtype)
            if mine.shape != want.shape or not torch.equal(mine, want):
                differ.append(name)
                if mine.shape == want.shape:
                    worst = max(worst, float((mine.float() - want.float()).abs().max()))
        missing = sorted(set(weights.hf) - set(theirs))
        return {
            "engine": actor.engine_index,
            "dtype": str(actor.engine.dtype).removeprefix("torch."),
            "tensors": len(theirs),
            "differ": len(differ),
            "differ_names": differ[:3],
            "max_abs_diff": worst,
            "missing": missing[:3],
            "version": int(actor.engine.weight_version),
        }

    return ray.get(engine.__ray_call__.remote(check, theirs_ref), timeout=READY_TIMEOUT_S)


def versions(actors: Actors) -> list[int]:
    import ray

    return ray.get(
        [e.__ray_call__.remote(lambda actor: int(actor.engine.weight_version)) for e in actors.engines],
        timeout=READY_TIMEOUT_S,
    )


def pushed_bytes(actors: Actors) -> int:
    import ray

    def count(actor: Any) -> int:  # in the trainer
        return sum(t.numel() * t.element_size() for t in actor.named_weights().values())

    return int(ray.get(actors.trainer.__ray_call__.remote(count), timeout=READY_TIMEOUT_S))


# ------------------------------------------------------------------------------------------------ the rows


@dataclass
class Row:
    backend: str
    transport: str
    bucket_bytes: int | None
    buckets: int | None
    model_bytes: int
    engines: int
    first_s: float
    steady_s: float
    steady_min_s: float
    gb_per_s_per_engine: float
    pushes_s: list[float]
    split: dict[str, float]  # rank 0's means over the timed pushes (collective only)
    first_split: dict[str, float]
    check: dict[str, Any]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def run_row(
    actors: Actors,
    backend: str,
    bucket_bytes: int | None,
    args: argparse.Namespace,
    row_index: int,
    next_version: Callable[[], int],
    model_bytes: int,
) -> Row:
    import ray

    from runtime.weight_sync.collective import CollectiveWeightSync
    from runtime.weight_sync.object_store import ObjectStoreWeightSync

    label = backend if bucket_bytes is None else f"{backend} {human(bucket_bytes)}"
    _phase[0] = f"checking the engines before row {label}"
    theirs = perturb(actors, args.seed + 1 + row_index)
    checked = actors.engines[row_index % len(actors.engines)]
    before = compare(checked, theirs)
    if before["differ"] == 0:
        raise BenchFailure(
            f"{label}: engine {before['engine']} already holds the trainer's weights (vacuous)"
        )

    if backend == "nccl":
        sync: Any = CollectiveWeightSync(
            bucket_bytes=int(bucket_bytes or 0),
            timeout_s=args.push_timeout,
            ready_timeout_s=args.push_timeout,
        )
    else:
        sync = ObjectStoreWeightSync()
    times: list[float] = []
    splits: list[dict[str, float]] = []
    for push in range(1 + args.repeats):
        version = next_version()
        _phase[0] = f"row {label}: push {push + 1} of {1 + args.repeats} (version {version})"
        began = time.perf_counter()
        try:
            refs = sync.push(actors.train, [actors.rollout], version=version, wait=False)
            done, pending = ray.wait(refs, num_returns=len(refs), timeout=args.push_timeout)
            if pending:
                raise BenchFailure(f"not done after --push-timeout {args.push_timeout:g} s")
            ray.get(done)
            times.append(time.perf_counter() - began)
            if isinstance(sync, CollectiveWeightSync):
                timings = sync.last_push_timings(actors.train, timeout_s=args.push_timeout)
                if timings is None:
                    raise BenchFailure("the trainer kept no timings of it")
                splits.append(timings)
        except Exception as exc:  # noqa: BLE001 - the engine's, the trainer's or Ray's reason, with the row
            raise BenchFailure(f"{label}: push of version {version}: {type(exc).__name__}: {exc}") from exc
        print(
            f"  {label}: push {push + 1}/{1 + args.repeats} (version {version}) {times[-1]:.3f} s", flush=True
        )

    _phase[0] = f"checking the engines after row {label}"
    after = compare(checked, theirs)
    held = versions(actors)
    after["before_differ"] = before["differ"]
    after["versions"] = held
    problems = []
    if after["differ"] or after["missing"]:
        problems.append(
            f"engine {after['engine']} differs from the trainer in {after['differ']} tensor(s) "
            f"{after['differ_names']} (max |diff| {after['max_abs_diff']:.3g}), misses {after['missing']}"
        )
    if any(v != version for v in held) or actors.rollout.weight_version != version:
        problems.append(
            f"engine versions {held}, the group's {actors.rollout.weight_version}, expected {version}"
        )
    after["ok"] = not problems
    steady = times[1:]
    mean = _mean(steady)
    keys = ("gather_s", "wait_s", "h2d_s", "broadcast_s", "send_s")
    row = Row(
        backend=backend,
        transport=actors.transport if backend == "nccl" else "object store",
        bucket_bytes=bucket_bytes,
        buckets=int(splits[-1]["buckets"]) if splits else None,
        model_bytes=model_bytes,
        engines=len(actors.engines),
        first_s=times[0],
        steady_s=mean,
        steady_min_s=min(steady),
        gb_per_s_per_engine=model_bytes / mean / 1e9,
        pushes_s=times,
        split={k: _mean([s[k] for s in splits[1:]]) for k in keys} if splits else {},
        first_split={k: splits[0][k] for k in keys} if splits else {},
        check=after,
    )
    if splits and int(splits[-1]["bytes"]) != model_bytes:
        problems.append(f"the trainer pushed {int(splits[-1]['bytes'])} bytes, {model_bytes} expected")
    if problems:
        row.check["ok"] = False
        row.check["problems"] = problems
    return row


def table(rows: Sequence[Row]) -> list[str]:
    head = (
        f"{'backend':<13} {'over':<12} {'bucket':>7} {'n':>4} {'first s':>8} {'steady s':>9} {'GB/s/eng':>9} "
        f"{'gather s':>9} {'wait s':>7} {'H2D s':>7} {'bcast s':>8}  check"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        split = [
            f"{r.split[k]:.3f}" if r.split else "-" for k in ("gather_s", "wait_s", "h2d_s", "broadcast_s")
        ]
        check = "exact" if r.check.get("ok") else "FAILED"
        lines.append(
            f"{r.backend:<13} {r.transport:<12} {human(r.bucket_bytes) if r.bucket_bytes else '-':>7} "
            f"{r.buckets if r.buckets is not None else '-':>4} {r.first_s:>8.3f} {r.steady_s:>9.3f} "
            f"{r.gb_per_s_per_engine:>9.2f} {split[0]:>9} {split[1]:>7} {split[2]:>7} {split[3]:>8}  {check}"
        )
    return lines


# ------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(args.json)
    report.setup["argv"] = list(sys.argv if argv is None else argv)
    watchdog = start_watchdog(args.deadline, report)
    setup, rows, failures = report.setup, report.rows, report.failures
    workdir = Path(tempfile.mkdtemp(prefix="relax-bench-weight-sync-"))
    token_dir = ray_environment()
    report.scratch = [workdir, *([token_dir] if token_dir else [])]
    try:
        _phase[0] = "building the model folder"
        started = time.perf_counter()
        setup["model"] = {"name": args.model, **build_model_folder(args.model, workdir / "model", args.seed)}
        setup["model_build_s"] = time.perf_counter() - started
        _phase[0] = "starting Ray"
        start_ray(num_cpus=max(4, args.engines + 2))
        _phase[0] = "starting the trainer and engine actors"
        started = time.perf_counter()
        actors = start_actors(workdir / "model", args.engines, args.trainer_dtype)
        setup["actors_start_s"] = time.perf_counter() - started
        setup["device"] = actors.device
        setup["transport"] = actors.transport
        model_bytes = pushed_bytes(actors)
        setup["pushed_bytes"] = model_bytes
        m = setup["model"]
        print(
            f"model {args.model}: {m['params'] / 1e6:.1f} M params, vocab {m['vocab']}; the trainer pushes "
            f"{model_bytes / 1e6:.1f} MB ({args.trainer_dtype}); {args.engines} fastgen engine(s); collective "
            f"over {actors.transport}; device {actors.device.get('gpu', 'cpu')}; model built in "
            f"{setup['model_build_s']:.1f} s, actors up in {setup['actors_start_s']:.1f} s",
            flush=True,
        )
        counter = iter(range(1, 1 << 30))
        plan = [
            (backend, size)
            for backend in args.backend_list
            for size in (args.bucket_sizes if backend == "nccl" else [None])
        ]
        for index, (backend, size) in enumerate(plan):
            row = run_row(actors, backend, size, args, index, lambda: next(counter), model_bytes)
            rows.append(row)
            if not row.check["ok"]:
                failures.extend(
                    f"{backend} {human(size) if size else ''}: {p}" for p in row.check["problems"]
                )
                break
        if "nccl" in args.backend_list:
            actors.train.close_weight_group()
    except BenchFailure as exc:
        failures.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - any other failure is reported the same way, with its type
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        _phase[0] = "stopping Ray"
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        finally:
            report.remove_scratch()
    watchdog.cancel()
    report.emit()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
