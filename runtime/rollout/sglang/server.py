"""SGLang's native HTTP API served by the built-in torch engine, so the runtime's SGLang client path runs for
real where SGLang cannot be installed.

    python -m runtime.rollout.sglang.server --model-path DIR --host 127.0.0.1 --port 30000 --config FILE.yaml

With an API key (`api-key:` in the `--config` YAML, as SGLang reads it, or `--api-key`, which `ps` shows),
every route answers 401 unless the request carries `Authorization: Bearer <key>` — `/health` included,
unlike SGLang, which leaves `/health*` and `/metrics` open.

Routes are thin: parse with `protocol`, call the serving engine, answer in SGLang's shapes and status codes
(400 with `{"error": {"message"}}` for bad requests, as SGLang's `_create_error_response`). The endpoint
table and the differences from SGLang are in docs/reference/runtime.md ("SGLang protocol").

The serving engine is `FastGenServing` (fastgen_serving.py: continuous batching on fastgen) or
`ServingEngine` (serving.py: HF `generate`), chosen by `--relax-engine auto|fastgen|hf` (default:
`$RELAX_ROLLOUT_BACKEND`, else auto = fastgen on CUDA for an architecture fastgen implements; see
runtime/rollout/backend.py). `/get_server_info`'s `engine` names it (`relax-fastgen` / `relax-torch`).

The command line is SGLang's (`sglang.launch_server`): the flags in `passthrough.BUILTIN_READS` are
implemented (and the platform's --host, --port, --config/--api-key, --model-path, --tp-size); every other
SGLang server flag is accepted and named in one startup line ("SGLang server arguments the built-in engine
does not use: ..."), so a job's `--sglang-*` arguments reach this server as they reach SGLang's. A flag
that is not SGLang's is logged as such, never fatal (the capability check refuses those before a job
starts).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import sys
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.rollout.backend import RolloutBackend, backend_from_env, resolve_backend
from runtime.rollout.sglang.fastgen_serving import FastGenServing
from runtime.rollout.sglang.passthrough import SGLANG_SERVER_FLAGS
from runtime.rollout.sglang.protocol import (
    SGLANG_PROTOCOL_VERSION,
    GenerationRequest,
    ProtocolError,
    generate_response,
    normalize_generate,
)
from runtime.rollout.sglang.serving import EngineUnavailable, ServingEngine
from runtime.rollout.sglang.tensor_payload import RELAX_SAFETENSORS_FORMAT, decode_named_tensors
from runtime.rollout.sglang.weight_group import (
    FLATTENED,
    GROUP_NAME,
    LOAD_FORMATS,
    WeightGroup,
    WeightGroupError,
    metas_from_request,
)

log = logging.getLogger("runtime.rollout.sglang.server")

Serving = ServingEngine | FastGenServing  # the same interface: what the routes below call


# -- request bodies of the control endpoints (SGLang's io_struct names; unknown fields ignored) ----------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class UpdateWeightFromDiskBody(_Body):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsFromTensorBody(_Body):
    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class InitWeightsUpdateGroupBody(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = GROUP_NAME
    backend: str = "nccl"


class UpdateWeightsFromDistributedBody(_Body):
    names: list[str]
    dtypes: list[str] | None = None
    dtype_names: list[str] | None = None  # the name some SGLang versions give `dtypes`
    shapes: list[list[int]]
    group_name: str = GROUP_NAME
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None


class DestroyWeightsUpdateGroupBody(_Body):
    group_name: str = GROUP_NAME


class UpdateWeightVersionBody(_Body):
    new_version: str
    abort_all_requests: bool = True


class MemoryOccupationBody(_Body):
    tags: list[str] | None = None


class AbortBody(_Body):
    rid: str = ""
    abort_all: bool = False


@dataclass(frozen=True)
class ServerArgs:
    """The launch flags we parse, under SGLang's names; `/get_server_info` reports them."""

    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None  # reported, not used: there is no KV pool to size
    max_running_requests: int | None = None  # the largest batch one forward takes
    random_seed: int | None = None
    skip_tokenizer_init: bool = False
    served_model_name: str | None = None  # reported, not used: no OpenAI-compatible routes here
    context_length: int | None = None  # None: no limit (SGLang takes the model config's)
    allow_auto_truncate: bool = False
    log_level: str = "info"
    relax_watch_pid: int | None = None  # ours: exit when this process (the launching actor) is gone
    relax_engine: str | None = None  # ours: auto | fastgen | hf (None: $RELAX_ROLLOUT_BACKEND, else auto)
    api_key: str | None = field(default=None, repr=False)  # never reported by /get_server_info


# -- errors in SGLang's shapes ------------------------------------------------------------------------------------


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    # SGLang answers body validation errors with 400 (FastAPI's default is 422).
    assert isinstance(exc, RequestValidationError)
    message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return JSONResponse(
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
        status_code=400,
    )


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = await request.json()
    except ValueError as exc:
        raise ProtocolError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("the body must be a JSON object")
    return data


# -- the API key ----------------------------------------------------------------------------------------------------


class BearerKeyMiddleware:
    """Every HTTP request must carry `Authorization: Bearer <key>`; anything else gets 401 before any route
    runs (so it changes nothing). Compared in constant time; the key is never echoed or logged."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"error": {"message": "Unauthorized"}},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)


# -- the app --------------------------------------------------------------------------------------------------------


def create_app(serving: Serving, args: ServerArgs) -> FastAPI:
    """The FastAPI app over a constructed engine (tests build it in-process; `main` serves it)."""

    groups: dict[str, WeightGroup] = {}  # /init_weights_update_group's, by name

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        serving.start()
        try:
            yield
        finally:
            for group in groups.values():
                group.leave()
            await asyncio.to_thread(serving.close)

    app = FastAPI(
        title="relax built-in engine (SGLang protocol)",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    if args.api_key:
        app.add_middleware(BearerKeyMiddleware, api_key=args.api_key)
    started = time.time()
    tokenizer = None if args.skip_tokenizer_init else serving.tokenizer

    def encode(text: str) -> list[int]:
        assert tokenizer is not None
        return list(tokenizer(text)["input_ids"])

    def token_text(token_id: int) -> str:
        return "" if tokenizer is None else tokenizer.decode([token_id])

    async def run_generate(body: dict[str, Any]) -> Any:
        normalized = normalize_generate(
            body, None if tokenizer is None else encode, vocab_size=serving.vocab_size
        )
        fit_context(normalized.requests, args.context_length, allow_auto_truncate=args.allow_auto_truncate)
        futures = serving.submit(normalized.requests)
        outputs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        items = [
            generate_response(out, req, token_text=token_text)
            for out, req in zip(outputs, normalized.requests, strict=True)
        ]
        if args.skip_tokenizer_init:
            for item in items:
                item.pop("text", None)
        return items[0] if normalized.is_single else items

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            return JSONResponse(await run_generate(await _json_body(request)))
        except ProtocolError as exc:
            return _error(str(exc))
        except EngineUnavailable as exc:
            return _error(str(exc), status=503)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """One greedy token, as SGLang's probe. Skipped (200) while the engine is busy (SGLang ignores the
        probe then too) and while its memory is released on purpose."""
        memory = serving.memory_state()
        if serving.load()["running"] or "released" in (memory["weights"], memory["kv_cache"]):
            return Response(status_code=200)
        probe = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        try:
            await asyncio.wait_for(run_generate(probe), timeout=20)
        except Exception:  # noqa: BLE001 - any failure is "unhealthy"
            log.exception("health_generate failed")
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info() -> dict[str, Any]:
        config = serving.hf_config
        return {
            "model_path": serving.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": serving.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
        }

    def server_info() -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(args).items() if k != "api_key"},
            "model_path": serving.model_path,
            "version": SGLANG_PROTOCOL_VERSION,
            "engine": serving.engine_name,  # ours: a real SGLang server has no such key
            "weight_version": serving.weight_version,
            "startup_time": started,
            "internal_states": [{"load": serving.load(), **serving.stats}],
            "memory_occupation": serving.memory_state(),
            "max_batch_size": serving.max_batch_size,
            "tensor_load_formats": [RELAX_SAFETENSORS_FORMAT],
            # ours: the payloads /update_weights_from_distributed takes besides SGLang's per-tensor one
            "distributed_load_formats": [FLATTENED],
        }

    app.get("/get_model_info")(model_info)
    app.get("/model_info")(model_info)
    app.get("/get_server_info")(server_info)
    app.get("/server_info")(server_info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if serving.flush_cache():
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse(
            "Cache not flushed: there are running or waiting requests.\n", status_code=400
        )

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightFromDiskBody) -> Response:
        if body.abort_all_requests:
            serving.abort(abort_all=True, message="Aborted by a weight update")
        try:
            message = await asyncio.to_thread(
                serving.update_weights_from_disk, body.model_path, weight_version=body.weight_version
            )
        except (ProtocolError, ValueError, OSError) as exc:
            return JSONResponse(
                {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0},
                status_code=400,
            )
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(body: UpdateWeightsFromTensorBody) -> Response:
        if body.load_format != RELAX_SAFETENSORS_FORMAT:
            return JSONResponse(
                {
                    "success": False,
                    "message": (
                        f"load_format={body.load_format!r} is not accepted: this server takes "
                        f"load_format={RELAX_SAFETENSORS_FORMAT!r} (base64 safetensors bytes), not SGLang's "
                        "ForkingPickler payload (it would unpickle request data and needs the sender's "
                        "shared memory)"
                    ),
                },
                status_code=400,
            )
        if len(body.serialized_named_tensors) != args.tp_size:
            return JSONResponse(
                {
                    "success": False,
                    "message": f"expected {args.tp_size} serialized_named_tensors entries (tp_size)",
                },
                status_code=400,
            )
        if body.abort_all_requests:
            serving.abort(abort_all=True, message="Aborted by a weight update")
        try:
            named = await asyncio.to_thread(decode_named_tensors, body.serialized_named_tensors[0])
            message = await asyncio.to_thread(
                serving.update_weights_from_tensors, named, weight_version=body.weight_version
            )
        except (ProtocolError, ValueError) as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=400)
        return JSONResponse({"success": True, "message": message})

    def refused(message: str) -> JSONResponse:
        return JSONResponse({"success": False, "message": message}, status_code=400)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(body: InitWeightsUpdateGroupBody) -> Response:
        """Join a trainer's weight-update group as rank `rank_offset` (one process: tp 1); answers once
        the group is formed (gloo) or its store reached (NCCL connects at the first broadcast)."""
        if body.group_name in groups:
            return refused(f"Failed to initialize custom process group: {body.group_name!r} already exists.")
        try:
            group = await asyncio.to_thread(
                WeightGroup.join,
                master_address=body.master_address,
                master_port=body.master_port,
                rank=body.rank_offset,
                world_size=body.world_size,
                group_name=body.group_name,
                backend=body.backend,
            )
        except (WeightGroupError, ValueError) as exc:
            return refused(f"Failed to initialize custom process group: {exc}.")
        groups[body.group_name] = group
        return JSONResponse({"success": True, "message": "Succeeded to initialize custom process group."})

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(body: UpdateWeightsFromDistributedBody) -> Response:
        """Receive one bucket broadcast by rank 0 (`weight_group`), then load it
        (`serving.update_weights_from_distributed`). What the metadata describes is always received first,
        so a refused bucket never leaves the broadcast hanging for the trainer and the other engines."""
        group = groups.get(body.group_name)
        if group is None:
            return refused(
                f"weight-update group {body.group_name!r} is not initialized: call /init_weights_update_group first"
            )
        try:
            dtypes = body.dtypes if body.dtypes is not None else body.dtype_names
            if dtypes is None:
                raise ValueError("dtypes: required (one torch dtype name per tensor)")
            metas = metas_from_request(body.names, dtypes, body.shapes)
            if body.load_format not in LOAD_FORMATS:
                raise ValueError(f"load_format: {body.load_format!r} is not one of {list(LOAD_FORMATS)}")
        except ValueError as exc:
            return refused(str(exc))
        if body.abort_all_requests:
            serving.abort(abort_all=True, message="Aborted by a weight update")
        device = serving.torch_device if group.backend == "nccl" else torch.device("cpu")
        try:
            named = await asyncio.to_thread(group.receive, metas, device=device, load_format=body.load_format)
            message = await asyncio.to_thread(
                serving.update_weights_from_distributed, named, weight_version=body.weight_version
            )
        except (WeightGroupError, ProtocolError, ValueError) as exc:
            return refused(f"Failed to update parameter online: {exc}")
        return JSONResponse({"success": True, "message": message})

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(body: DestroyWeightsUpdateGroupBody) -> Response:
        group = groups.pop(body.group_name, None)
        if group is None:
            return refused("The group to be destroyed does not exist.")
        await asyncio.to_thread(group.leave)
        return JSONResponse({"success": True, "message": "Succeeded to destroy custom process group."})

    @app.post("/update_weight_version")
    async def update_weight_version(body: UpdateWeightVersionBody) -> Response:
        if body.abort_all_requests:
            serving.abort(abort_all=True, message="Aborted by a weight version update")
        await asyncio.to_thread(serving.set_weight_version, body.new_version)
        return JSONResponse(
            {
                "success": True,
                "message": f"Weight version updated to {body.new_version}",
                "new_version": body.new_version,
            }
        )

    async def memory_route(request: Request, release: bool) -> Response:
        try:
            body = MemoryOccupationBody.model_validate(await _json_body(request))
            action = serving.release_memory if release else serving.resume_memory
            await asyncio.to_thread(action, body.tags)
        except (ProtocolError, ValueError) as exc:
            return _error(str(exc))
        return JSONResponse(None)  # SGLang's handler returns nothing: 200 with a null body

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(request: Request) -> Response:
        return await memory_route(request, release=True)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(request: Request) -> Response:
        return await memory_route(request, release=False)

    @app.post("/abort_request")
    async def abort_request(body: AbortBody) -> Response:
        if body.abort_all or body.rid:
            serving.abort(body.rid, abort_all=body.abort_all)
        else:
            log.warning("Ignore abort_request with empty rid and abort_all=False")
        return Response(status_code=200)

    return app


def fit_context(
    requests: list[GenerationRequest], context_length: int | None, *, allow_auto_truncate: bool = False
) -> None:
    """`--context-length` as SGLang's `TokenizerManager._validate_one_request`: a prompt of context_length
    tokens or more, or a prompt + max_new_tokens beyond it, is refused (400) with SGLang's messages; with
    `--allow-auto-truncate` the prompt is cut to context_length tokens and max_new_tokens to what is left."""
    if context_length is None:
        return
    for request in requests:
        prompt = len(request.input_ids)
        if prompt >= context_length:
            if not allow_auto_truncate:
                raise ProtocolError(
                    f"The input ({prompt} tokens) is longer than the model's context length "
                    f"({context_length} tokens)."
                )
            log.warning("the input (%d tokens) is cut to the context length (%d)", prompt, context_length)
            request.input_ids = request.input_ids[:context_length]
            prompt = context_length
        wanted = request.sampling.max_new_tokens
        if wanted + prompt > context_length:
            if not allow_auto_truncate:
                raise ProtocolError(
                    "Requested token count exceeds the model's maximum context length of "
                    f"{context_length} tokens. You requested a total of {wanted + prompt} tokens: {prompt} "
                    f"tokens from the input messages and {wanted} tokens for the completion. Please reduce "
                    "the number of tokens in the input messages or the completion to fit within the limit."
                )
            request.sampling = replace(request.sampling, max_new_tokens=max(0, context_length - prompt))


# -- command line ------------------------------------------------------------------------------------------------


def config_file_args(path: str) -> list[str]:
    """SGLang's `--config FILE.yaml`: a mapping of flag names (`api-key: ...`, `port: 30000`) turned into
    flags placed before the command line's, which win (SGLang's `ConfigArgumentMerger`)."""
    import yaml

    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"--config must be a YAML file, got {path}")
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError("the --config file must hold a mapping of flag names to values")
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            out += [flag] if value else []
        elif isinstance(value, list):
            out += [flag, *map(str, value)] if value else []
        else:
            out += [flag, str(value)]
    return out


def _with_config(argv: list[str]) -> list[str]:
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise ValueError("--config needs a file")
    return config_file_args(argv[at + 1]) + argv[:at] + argv[at + 2 :]


def _flag_groups(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """Left-over command-line words as (flag without `--`, its values), in order."""
    groups: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            groups.append((name, [value] if eq else []))
        elif groups:
            groups[-1][1].append(token)
        else:
            groups.append(("", [token]))
    return groups


def unused_arguments(args: ServerArgs, unknown: list[str]) -> tuple[list[str], list[str]]:
    """(SGLang server arguments given that the built-in engine does not use, words that are not SGLang
    server arguments at all), each as `--flag value...` text: the parsed ones first, then in command-line
    order."""
    unused = [
        f"--{flag} {value}"
        for flag, value in (
            ("mem-fraction-static", args.mem_fraction_static),
            ("served-model-name", args.served_model_name),
        )
        if value is not None
    ]
    foreign = []
    for name, values in _flag_groups(unknown):
        text = " ".join([f"--{name}", *values]) if name else " ".join(values)
        (unused if name in SGLANG_SERVER_FLAGS else foreign).append(text)
    return unused, foreign


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """SGLang's flag names: those in `passthrough.BUILTIN_READS` are implemented (`--context-length` by
    `fit_context`); any other SGLang server flag is accepted and named in one log line, so launch scripts
    written for `sglang.launch_server` (and a job's `--sglang-*` arguments) work unchanged. `--config
    FILE.yaml` as SGLang's (how the engine actor hands over the API key without putting it on the command
    line)."""
    argv = _with_config(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(
        description="SGLang-protocol HTTP server over the built-in torch engine",
        allow_abbrev=False,  # an SGLang flag we do not implement is never read as a prefix of one we do
    )
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", "--tp", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", "--dp", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--random-seed", type=int)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--served-model-name")
    p.add_argument("--context-length", type=int)
    p.add_argument("--allow-auto-truncate", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--relax-watch-pid", type=int, help="exit when this pid is gone (the launching actor)")
    p.add_argument(
        "--relax-engine",
        choices=[b.value for b in RolloutBackend],
        help="the model code behind the protocol: fastgen (continuous batching), hf (HF generate), or auto "
        "(fastgen on CUDA for an architecture it implements); default: $RELAX_ROLLOUT_BACKEND, else auto",
    )
    p.add_argument(
        "--api-key",
        help="require `Authorization: Bearer <key>` on every route (prefer `api-key:` in a --config "
        "file: a command line is visible to every user of the machine)",
    )
    known, unknown = p.parse_known_args(argv)
    args = ServerArgs(**{k: v for k, v in vars(known).items()})
    if args.tp_size != 1 or args.dp_size != 1:
        p.error("the built-in engine runs one process: --tp-size and --dp-size must be 1")
    if args.context_length is not None and args.context_length < 1:
        p.error("--context-length must be positive")
    unused, foreign = unused_arguments(args, unknown)
    if unused:
        log.info("SGLang server arguments the built-in engine does not use: %s", ", ".join(unused))
    if foreign:
        log.warning("arguments that are not SGLang server arguments, ignored: %s", ", ".join(foreign))
    if not args.api_key:
        log.warning(
            "no API key: anyone who can reach %s:%d can generate and replace the weights",
            args.host,
            args.port,
        )
    return args


def build_serving(args: ServerArgs, *, device: Any = None) -> Serving:
    """The serving engine `args.relax_engine` (or $RELAX_ROLLOUT_BACKEND) asks for, on `device` (default:
    `Device.detect()`)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from runtime.devices import Device, DeviceKind

    transformers.utils.logging.set_verbosity_error()  # HF warns about every unset/neutral sampling field
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    device = device or Device.detect()
    backend = resolve_backend(
        backend_from_env(args.relax_engine), args.model_path, cuda=device.kind is DeviceKind.CUDA
    )
    max_batch_size = args.max_running_requests or 256
    tokenizer = None
    if not args.skip_tokenizer_init:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
    if backend is RolloutBackend.FASTGEN:
        return FastGenServing.from_checkpoint(
            args.model_path, tokenizer, device=device, max_batch_size=max_batch_size
        )
    from runtime.rollout.engine import TorchRolloutEngine

    engine = TorchRolloutEngine(args.model_path, device=device, max_batch_size=max_batch_size)
    return ServingEngine(engine, tokenizer, model_path=args.model_path, max_batch_size=engine.max_batch_size)


def _watch_parent(pid: int, server: Any) -> None:
    """A launching Ray actor that is killed (SIGKILL) cannot stop its child; the child notices instead."""
    while not server.should_exit:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.warning("launching process %d is gone; shutting down", pid)
            server.should_exit = True
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    args = parse_args(argv)
    logging.getLogger().setLevel(args.log_level.upper())
    began = time.perf_counter()
    serving = build_serving(args)
    log.info(
        "model %s loaded in %.2f s (engine %s)",
        args.model_path,
        time.perf_counter() - began,
        serving.engine_name,
    )
    config = uvicorn.Config(
        create_app(serving, args), host=args.host, port=args.port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    if args.relax_watch_pid:
        threading.Thread(target=_watch_parent, args=(args.relax_watch_pid, server), daemon=True).start()
    log.info("serving the SGLang protocol on http://%s:%d", args.host, args.port)
    server.run()


if __name__ == "__main__":
    main()
