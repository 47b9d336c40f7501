"""Rollout engines driven over SGLang's HTTP API, with the methods of the built-in `RolloutEngineActor`
(`ready`, `generate`, `load_weights`, `offload`, `onload`), so `RolloutGroup`, `Roles` and the weight-sync
backends use them unchanged.

- `HttpRolloutEngine(address)`: drives a server that is already running (external engines).
- `SGLangEngineActor(hf_checkpoint, engine_index=...)`: launches a server as a child process on a free
  port of its node, then drives it: `python -m sglang.launch_server` where sglang is importable and CUDA
  present, else the built-in engine's server. Its constructor takes `RolloutEngineActor`'s arguments, and
  `server_args`: the job's SGLang server arguments (`passthrough.server_argv` of the spec's `--sglang-*`),
  put on either server's command line after the platform's own flags.
- `external_engine_actors(addrs)`: one light `HttpRolloutEngine` actor per `--rollout-external-engine-addrs`.

The servers a job launches listen on 127.0.0.1 (or, with `RELAX_ENGINE_HOST=node` in the Ray cluster's
environment, on the node's own address; nothing else) and require the job's engine secret as
`Authorization: Bearer` on every route. The secret reaches the server in a 0600 `--config` YAML file
(SGLang's own `--config`; removed once the server is up), never on its command line or in an
environment; server log tails quoted in errors have it masked.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import ipaddress
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import httpx
import torch

from runtime.registry import Registry
from runtime.rollout.params import GenerationResult, SamplingParams
from runtime.rollout.sglang.client import (
    SGLangClient,
    SGLangEngineError,
    auth_headers,
    codec_for,
    engine_url,
)
from runtime.rollout.sglang.protocol import to_sglang_sampling_params
from runtime.rollout.sglang.weight_group import (
    FLATTENED,
    JoinOrder,
    PushGate,
    PushOrder,
    gate_store,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[3]  # the folder holding `runtime/`, for the child's PYTHONPATH
ENGINE_HOST_ENV = "RELAX_ENGINE_HOST"  # "127.0.0.1" (default) or "node": where launched servers listen
MASK = "[redacted]"


class _EventLoopThread:
    """An asyncio loop on a daemon thread, so the synchronous actor methods can await the async client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sglang-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


def row_seed(seed: int, row: int) -> int:
    """A distinct `sampling_seed` per row. SGLang's deterministic sampler hashes (seed, position): rows of
    one prompt sharing a seed would come out identical. Engines get seed + engine_index from
    `RolloutGroup`, so the row index is mixed in with a large multiplier rather than added."""
    return (seed * 1_000_003 + row) % (1 << 63)


class HttpRolloutEngine:
    """Drives one running server that speaks SGLang's native protocol (SGLang itself, or ours) and offers
    `RolloutEngineActor`'s methods on top of it. Weights sent with `load_weights` go through
    `/update_weights_from_tensor` in buckets, in the payload the server takes (`client.codec_for`).
    `api_key`: the server's (sent as `Authorization: Bearer` on every request)."""

    def __init__(
        self,
        address: str,
        *,
        engine_index: int = 0,
        api_key: str | None = None,
        ready_timeout_s: float = 120.0,
        request_timeout_s: float = 3600.0,
        weight_bucket_bytes: int | None = 256 << 20,
    ) -> None:
        self.address = engine_url(address)
        self.engine_index = engine_index
        self.weight_bucket_bytes = weight_bucket_bytes
        self.weight_version = 0
        self._io = _EventLoopThread()

        async def connect() -> SGLangClient:  # the httpx client belongs to the loop that uses it
            return SGLangClient(self.address, api_key=api_key, request_timeout_s=request_timeout_s)

        self.client = self._io.run(connect())
        self._io.run(self.client.wait_until_ready(ready_timeout_s))
        info = self._io.run(self.client.server_info())
        self.server_kind = str(info.get("engine", "sglang"))
        self.tp_size = int(info.get("tp_size", 1) or 1)
        self._codec = codec_for(info)
        # SGLang's per-tensor payload always; ours also takes one flattened broadcast per bucket
        self._distributed_formats: list[str | None] = [
            *(f for f in info.get("distributed_load_formats") or () if f == FLATTENED),
            None,
        ]
        self._weight_gate: tuple[Any, str, str] | None = None  # (store client, group name, member)

    # -- RolloutEngineActor's interface ---------------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "engine_index": self.engine_index,
            "address": self.address,
            "engine": self.server_kind,
            "external": True,  # a server this job did not launch (`SGLangEngineActor` says False)
        }

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        """One batch `/generate` with log-probs; results in prompt order, as the built-in engine's.
        `budgets[i]` caps prompt i's new tokens below `params.max_new_tokens` (SGLang takes per-request
        sampling_params, so each row carries its own max_new_tokens)."""
        if not prompts:
            return []
        base = to_sglang_sampling_params(params)
        sampling: dict[str, Any] | list[dict[str, Any]] = base
        if budgets is not None or params.seed is not None:
            sampling = []
            for row in range(len(prompts)):
                item = dict(base)
                if budgets is not None:
                    item["max_new_tokens"] = max(0, min(int(budgets[row]), params.max_new_tokens))
                if params.seed is not None:
                    item["sampling_seed"] = row_seed(params.seed, row)
                sampling.append(item)
        outputs = self._io.run(self.client.generate(prompts, sampling, return_logprob=True))
        return [out.to_generation_result(self.weight_version) for out in outputs]

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> int:
        self._io.run(
            self.client.update_weights_from_tensor(
                named_tensors,
                weight_version=str(version),
                codec=self._codec,
                tp_size=self.tp_size,
                bucket_bytes=self.weight_bucket_bytes,
            )
        )
        self.weight_version = version
        return version

    def offload(self) -> None:
        """Release weights and KV cache (SGLang's memory saver; our engine moves weights to a CPU backup)."""
        self._io.run(self.client.release_memory_occupation())

    def onload(self) -> None:
        self._io.run(self.client.resume_memory_occupation())

    # -- the collective weight sync (`runtime.weight_sync.collective`), over SGLang's own distributed calls --
    def weight_group_info(self) -> dict[str, Any]:
        """The server's ranks in a weight-update group (its tensor-parallel size) and the payloads it takes."""
        return {
            "ranks": self.tp_size,
            "load_formats": self._distributed_formats,
            "engine_index": self.engine_index,
        }

    def weight_group_join(self, order: JoinOrder) -> None:
        """The server joins through `/init_weights_update_group`; this actor keeps a client of the group's
        store for the push gate (`PushGate`)."""
        self.weight_group_leave()
        store = gate_store(order.master_address, order.master_port, order.timeout_s)
        self._io.run(
            self.client.init_weights_update_group(
                master_address=order.master_address,
                master_port=order.master_port,
                rank_offset=order.rank_offset,
                world_size=order.world_size,
                group_name=order.group_name,
                backend=order.backend,
            )
        )
        self._weight_gate = (store, order.group_name, order.member)

    def weight_push_receive(self, order: PushOrder) -> int:
        """Check the version, wait for the trainer's go, then one `/update_weights_from_distributed` per
        bucket (the version with the last). A refused bucket does not stop the others (the server still
        receives them, so the broadcast completes for everyone); none of them carries the version, and the
        first refusal is raised."""
        if self._weight_gate is None or self._weight_gate[1] != order.group_name:
            raise SGLangEngineError(
                self.address, "weight push", f"not in weight-update group {order.group_name!r}"
            )
        store, group_name, member = self._weight_gate
        gate = PushGate(store, group_name, order.push_id)
        problem = None
        if self.weight_version != order.expected:
            problem = f"the engine holds version {self.weight_version}, the driver expected {order.expected}"
        elif order.version < order.expected:
            problem = f"older than the engine's version {self.weight_version}"
        if problem is not None:
            gate.abort(f"{order.what(member)}: {problem}")
            raise SGLangEngineError(self.address, "weight push", f"{order.what(member)}: {problem}")
        gate.ready(member)
        gate.wait_go(member, order.ready_timeout_s)
        failure: str | None = None
        for index, bucket in enumerate(order.buckets):
            last = index == len(order.buckets) - 1
            try:
                self._io.run(
                    self.client.update_weights_from_distributed(
                        bucket,
                        group_name=group_name,
                        weight_version=str(order.version) if last and failure is None else None,
                        flush_cache=last,
                        load_format=order.load_format,
                    )
                )
            except SGLangEngineError as exc:
                failure = failure or f"bucket {index} ({[m.name for m in bucket[:3]]} ...): {exc}"
        if failure is not None:
            raise SGLangEngineError(self.address, "weight push", f"{order.what(member)}: {failure}")
        self.weight_version = order.version
        return order.version

    def weight_group_leave(self, group_name: str | None = None) -> None:
        gate, self._weight_gate = self._weight_gate, None
        if gate is not None and (group_name is None or gate[1] == group_name):
            try:
                self._io.run(self.client.destroy_weights_update_group(gate[1]))
            except SGLangEngineError as exc:  # best effort: the server may have lost the group already
                log.warning("engine %d: %s", self.engine_index, exc)
        elif gate is not None:
            self._weight_gate = gate

    # -- beyond the built-in actor ----------------------------------------------------------------------------
    def update_weights_from_disk(self, model_path: str, version: int) -> int:
        self._io.run(self.client.update_weights_from_disk(model_path, weight_version=str(version)))
        self.weight_version = version
        return version

    def flush_cache(self) -> None:
        self._io.run(self.client.flush_cache())

    def abort(self, rid: str = "", *, abort_all: bool = False) -> None:
        self._io.run(self.client.abort_request(rid, abort_all=abort_all))

    def server_info(self) -> dict[str, Any]:
        return self._io.run(self.client.server_info())

    def get_address(self) -> str:
        return self.address

    def shutdown(self) -> None:
        self._io.run(self.client.aclose())
        self._io.close()


# -- launching a server -----------------------------------------------------------------------------------------


class EngineLauncher(StrEnum):
    BUILTIN = "builtin"  # python -m runtime.rollout.sglang.server: the torch engine, CPU or GPU
    SGLANG = "sglang"  # python -m sglang.launch_server: needs sglang and CUDA


@dataclass(frozen=True)
class LaunchSpec:
    """What a launcher needs to build the server's command line."""

    model_path: str
    host: str
    port: int
    tp_size: int = 1
    mem_fraction_static: float | None = None
    extra_args: tuple[str, ...] = ()  # the job's SGLang server flags, appended verbatim
    config_path: str | None = None  # SGLang's `--config` YAML: holds the API key, off the command line


ENGINE_LAUNCHERS: Registry[Callable[[LaunchSpec], list[str]]] = Registry("rollout engine launcher")


@ENGINE_LAUNCHERS.register(EngineLauncher.BUILTIN)
def builtin_server_command(spec: LaunchSpec) -> list[str]:
    command = [sys.executable, "-m", "runtime.rollout.sglang.server", "--model-path", spec.model_path]
    command += ["--host", spec.host, "--port", str(spec.port), "--tp-size", str(spec.tp_size)]
    command += ["--relax-watch-pid", str(os.getpid())]  # the child exits when this actor is killed
    if spec.config_path:
        command += ["--config", spec.config_path]
    if spec.mem_fraction_static is not None:
        command += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    return command + list(spec.extra_args)


@ENGINE_LAUNCHERS.register(EngineLauncher.SGLANG)
def sglang_server_command(spec: LaunchSpec) -> list[str]:
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model_path]
    command += ["--host", spec.host, "--port", str(spec.port), "--tp-size", str(spec.tp_size)]
    command += ["--enable-memory-saver"]  # release/resume_memory_occupation need it
    if spec.config_path:
        command += ["--config", spec.config_path]
    if spec.mem_fraction_static is not None:
        command += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    return command + list(spec.extra_args)


def default_launcher() -> EngineLauncher:
    """SGLang where it can run (importable, CUDA present), else the built-in engine's server."""
    if importlib.util.find_spec("sglang") is not None and torch.cuda.is_available():
        return EngineLauncher.SGLANG
    return EngineLauncher.BUILTIN


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def engine_host(host: str | None = None) -> str:
    """Where a launched server listens: 127.0.0.1 by default; `node` (or this node's own address) when
    a pool needs its engines reachable from other nodes (`RELAX_ENGINE_HOST=node` in the environment of
    the pool's `ray start`). Never a wildcard address or another machine's."""
    value = (host or os.environ.get(ENGINE_HOST_ENV) or "127.0.0.1").strip()
    if _is_loopback(value):
        return value
    import ray

    node = ray.util.get_node_ip_address()
    if value in ("node", node):
        return node
    raise ValueError(
        f"engine servers listen on 127.0.0.1 or on this node's own address ({node}), not {value!r} "
        f"(set {ENGINE_HOST_ENV}=node for the node's address)"
    )


def engine_secret() -> str:
    """A fresh engine secret (256 random bits), what a job's engine servers require as `Authorization:
    Bearer`; the `rje_` prefix marks it for log redaction."""
    return f"rje_{secrets.token_hex(32)}"


def write_server_config(folder: Path, api_key: str) -> Path:
    """The server's `--config` YAML holding its API key: created 0600 (never readable by others, not even
    while written) in the actor's private folder."""
    import yaml

    path = folder / "server-config.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(yaml.safe_dump({"api-key": api_key}))
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


try:  # loaded here, not in the child: between fork and exec only a plain call is safe
    _LIBC: Any = ctypes.CDLL(None) if sys.platform == "linux" else None
except OSError:  # pragma: no cover
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: SIGTERM the child when the thread that forked it ends. Only set when forking from the main
    # thread, where that means the actor process. SGLang has no parent watch of its own.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class SGLangEngineActor(HttpRolloutEngine):
    """A rollout engine that is a server process: launched on a free port of this actor's node (it
    inherits the actor's GPU visibility), driven over HTTP. Constructor arguments are those of
    `RolloutEngineActor`, plus the launcher's. `api_key`: the job's engine secret, which the server
    requires on every request (None: one of the actor's own, so a server is never open)."""

    def __init__(
        self,
        hf_checkpoint: str,
        *,
        engine_index: int,
        num_threads: int = 1,
        max_batch_size: int = 256,
        launcher: str | None = None,
        host: str | None = None,
        api_key: str | None = None,
        mem_fraction_static: float | None = None,
        server_args: Sequence[str] = (),
        ready_timeout_s: float = 300.0,
        launch_attempts: int = 3,
    ) -> None:
        self.launcher = EngineLauncher(launcher) if launcher else default_launcher()
        host = engine_host(host)
        api_key = api_key or engine_secret()
        self._api_key = api_key
        extra = list(server_args)  # the job's SGLang server arguments (`passthrough.server_argv`)
        if self.launcher is EngineLauncher.BUILTIN and "--max-running-requests" not in extra:
            extra += ["--max-running-requests", str(max_batch_size)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
            "OMP_NUM_THREADS": str(max(1, num_threads)),
            "TOKENIZERS_PARALLELISM": "false",
        }
        folder = Path(tempfile.mkdtemp(prefix="relax-engine-"))  # 0700
        self.log_path = folder / "server.log"
        config = write_server_config(folder, api_key)
        self.process: subprocess.Popen[bytes] | None = None
        for attempt in range(1, launch_attempts + 1):
            port = free_port(host)
            spec = LaunchSpec(
                hf_checkpoint,
                host,
                port,
                mem_fraction_static=mem_fraction_static,
                extra_args=tuple(extra),
                config_path=str(config),
            )
            command = ENGINE_LAUNCHERS.get(self.launcher)(spec)
            log.info("engine %d: launching %s", engine_index, " ".join(command))
            with open(self.log_path, "ab") as log_file:
                self.process = subprocess.Popen(
                    command,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(REPO_ROOT),
                    preexec_fn=_die_with_launcher
                    if threading.current_thread() is threading.main_thread()
                    else None,
                )
            self._launched_from_main_thread = threading.current_thread() is threading.main_thread()
            address = f"{host}:{port}"
            try:
                self._wait_for_server(address, ready_timeout_s)
                break
            except SGLangEngineError:
                self.shutdown_server()
                port_taken = "address already in use" in self.log_tail().lower()
                if not port_taken or attempt == launch_attempts:
                    config.unlink(missing_ok=True)
                    raise
                log.warning("engine %d: port %d was taken; retrying on another", engine_index, port)
        config.unlink(missing_ok=True)  # the server has read it; the key lives on in memory only
        try:
            super().__init__(
                address, engine_index=engine_index, api_key=api_key, ready_timeout_s=ready_timeout_s
            )
        except BaseException:
            self.shutdown_server()
            raise

    def _wait_for_server(self, address: str, timeout_s: float) -> None:
        """Poll /health; a child that exits first fails at once, with the end of its log."""
        deadline = time.monotonic() + timeout_s
        url = f"{engine_url(address)}/health"
        headers = auth_headers(self._api_key)
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise SGLangEngineError(
                    engine_url(address),
                    "launch",
                    f"server exited with {code}; log {self.log_path}:\n{self.log_tail()}",
                )
            try:
                if httpx.get(url, headers=headers, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise SGLangEngineError(
                    engine_url(address),
                    "launch",
                    f"not healthy after {timeout_s:.0f} s; log tail:\n{self.log_tail()}",
                )
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log, the API key masked (SGLang logs its server args, key included)."""
        try:
            text = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
        return text.replace(self._api_key, MASK) if self._api_key else text

    def ready(self) -> dict[str, Any]:
        info = super().ready()
        info["launcher"] = str(self.launcher)
        info["external"] = False
        info["server_pid"] = self.process.pid if self.process else None
        info["dies_with_actor"] = (
            "watch-pid"
            if self.launcher is EngineLauncher.BUILTIN
            else ("pdeathsig" if self._launched_from_main_thread else "none")
        )
        return info

    def shutdown_server(self, timeout_s: float = 10.0) -> None:
        # `getattr`: Ray's actor class wrapper inherits `__del__`, and it never started a server
        process, self.process = getattr(self, "process", None), None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def shutdown(self) -> None:
        super().shutdown()
        self.shutdown_server()

    def __del__(self) -> None:  # graceful actor exit; a killed actor's child notices through its watch
        try:
            self.shutdown_server(timeout_s=2.0)
        except Exception:  # noqa: BLE001
            pass


def external_engine_actors(
    addrs: Sequence[str],
    *,
    runtime_env: dict[str, Any] | None = None,
    ready_timeout_s: float = 120.0,
    api_key: str | None = None,
) -> list[Any]:
    """One `HttpRolloutEngine` actor per already-running server, in list order. They hold no slot
    (num_cpus=0): the servers' resources are not this job's. `api_key`: the servers' key, if they have
    one (the job spec has no parameter for it today: external engines are reached without a key)."""
    import ray

    return [
        ray.remote(HttpRolloutEngine)
        .options(num_cpus=0, runtime_env=runtime_env)
        .remote(addr, engine_index=index, api_key=api_key, ready_timeout_s=ready_timeout_s)
        for index, addr in enumerate(addrs)
    ]
