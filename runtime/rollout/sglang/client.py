"""The runtime's client of SGLang's native HTTP API (async, httpx): the same calls drive a real SGLang
server on GPU and the built-in engine's server (`runtime.rollout.sglang.server`).

Connection failures (nothing reached the server) are retried with exponential backoff; every error names
the engine's address and the endpoint, and carries the server's own message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from runtime.rollout.sglang.protocol import SGLangGeneration, parse_generate_outputs
from runtime.rollout.sglang.tensor_payload import (
    RELAX_SAFETENSORS_FORMAT,
    SafetensorsCodec,
    SGLangIpcCodec,
    TensorCodec,
    bucket_named_tensors,
)
from runtime.rollout.sglang.weight_group import GROUP_NAME, TensorMeta

log = logging.getLogger(__name__)


class SGLangEngineError(RuntimeError):
    """A call to an engine failed: unreachable, an HTTP error status, or `success: false`."""

    def __init__(self, address: str, endpoint: str, message: str, *, status: int | None = None) -> None:
        self.address = address
        self.endpoint = endpoint
        self.status = status
        where = f"SGLang engine at {address}: {endpoint}"
        super().__init__(f"{where} failed{f' ({status})' if status is not None else ''}: {message}")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of requests that never reached the server (connect errors): `attempts` tries in all,
    waits doubling from `initial_backoff_s` up to `max_backoff_s`."""

    attempts: int = 5
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 4.0


def engine_url(address: str) -> str:
    """`host:port` (as `--rollout-external-engine-addrs` lists them) or a full URL -> base URL."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def codec_for(server_info: Mapping[str, Any]) -> TensorCodec:
    """Our safetensors payload for servers that list it (the built-in engine), SGLang's own otherwise."""
    if RELAX_SAFETENSORS_FORMAT in (server_info.get("tensor_load_formats") or ()):
        return SafetensorsCodec()
    return SGLangIpcCodec()


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>` (SGLang's `--api-key`, our server's too), or nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class SGLangClient:
    """One engine's HTTP API. Use as `async with SGLangClient("127.0.0.1:30000") as c: ...` or call
    `aclose()`. `request_timeout_s` bounds one call (generation of a large batch can take minutes).
    `api_key`: sent as `Authorization: Bearer` on every request, health probes included."""

    def __init__(
        self,
        address: str,
        *,
        api_key: str | None = None,
        request_timeout_s: float = 3600.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.address = engine_url(address)
        self.retry = retry
        self._http = httpx.AsyncClient(
            base_url=self.address,
            headers=auth_headers(api_key),
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            transport=transport,
        )

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport ------------------------------------------------------------------------------------------
    async def _send(
        self, method: str, path: str, *, json: Any = None, retry: RetryPolicy | None = None
    ) -> httpx.Response:
        policy = retry or self.retry
        delay = policy.initial_backoff_s
        endpoint = f"{method} {path}"
        for attempt in range(1, policy.attempts + 1):
            try:
                response = await self._http.request(method, path, json=json)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == policy.attempts:
                    raise SGLangEngineError(
                        self.address, endpoint, f"unreachable after {attempt} attempt(s): {exc!r}"
                    ) from exc
                log.debug("%s %s: %r; retry %d in %.2f s", self.address, endpoint, exc, attempt, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, policy.max_backoff_s)
                continue
            except httpx.HTTPError as exc:  # sent, then lost: not retried (the server may have acted on it)
                raise SGLangEngineError(self.address, endpoint, repr(exc)) from exc
            if response.status_code >= 400:
                raise SGLangEngineError(
                    self.address, endpoint, _error_message(response), status=response.status_code
                )
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        response = await self._send(method, path, json=body)
        if not response.content:
            return None
        return response.json()

    async def _checked(self, path: str, body: Mapping[str, Any]) -> str:
        """POST a control request answered with `{success, message}`; `success: false` raises."""
        data = await self._json("POST", path, dict(body))
        if isinstance(data, dict) and data.get("success") is False:
            raise SGLangEngineError(self.address, f"POST {path}", str(data.get("message")))
        return str((data or {}).get("message", "")) if isinstance(data, dict) else ""

    # -- health and info --------------------------------------------------------------------------------------
    async def health(self) -> bool:
        """GET /health answered 200 (no retries: for polling)."""
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def health_generate(self) -> bool:
        try:
            return (await self._http.get("/health_generate")).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_until_ready(self, timeout_s: float = 120.0, *, interval_s: float = 0.2) -> None:
        """Poll /health until 200 (SGLang answers 503 while starting); raise after `timeout_s`, or at once
        when the server refuses our API key (401/403)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = (await self._http.get("/health")).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                return
            if status in (401, 403):
                raise SGLangEngineError(
                    self.address, "GET /health", "the server refused the API key", status=status
                )
            if time.monotonic() >= deadline:
                raise SGLangEngineError(self.address, "GET /health", f"not ready after {timeout_s:.0f} s")
            await asyncio.sleep(interval_s)

    async def model_info(self) -> dict[str, Any]:
        return await self._json("GET", "/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        return await self._json("GET", "/get_server_info")

    # -- generation ---------------------------------------------------------------------------------------------
    async def generate_raw(self, body: Mapping[str, Any]) -> Any:
        """POST /generate with a body as given; the JSON response (one object or a list)."""
        return await self._json("POST", "/generate", dict(body))

    async def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[str],
        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        return_logprob: bool = True,
        rids: Sequence[str] | None = None,
    ) -> list[SGLangGeneration]:
        """One batch request: token-id prompts (or texts), one `sampling_params` dict for all or one per
        prompt (`n` > 1 gives n outputs per prompt, prompt-major). Outputs in request order."""
        if not prompts:
            return []
        key = "text" if isinstance(prompts[0], str) else "input_ids"
        body: dict[str, Any] = {
            key: [p if isinstance(p, str) else [int(t) for t in p] for p in prompts],
            "sampling_params": dict(sampling_params)
            if isinstance(sampling_params, Mapping)
            else [dict(p) for p in sampling_params],
            "return_logprob": return_logprob,
        }
        if rids is not None:
            body["rid"] = list(rids)
        outputs = parse_generate_outputs(await self.generate_raw(body))
        n = int(sampling_params.get("n", 1) or 1) if isinstance(sampling_params, Mapping) else 1
        if len(outputs) != len(prompts) * n:
            raise SGLangEngineError(
                self.address, "POST /generate", f"{len(outputs)} outputs for {len(prompts)} prompts x n={n}"
            )
        return outputs

    async def abort_request(self, rid: str = "", *, abort_all: bool = False) -> None:
        await self._send("POST", "/abort_request", json={"rid": rid, "abort_all": abort_all})

    # -- weights --------------------------------------------------------------------------------------------------
    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> str:
        """Load a HF folder the server can read (shared storage, or its own disk)."""
        body: dict[str, Any] = {
            "model_path": model_path,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        return await self._checked("/update_weights_from_disk", body)

    async def update_weights_from_tensor(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        *,
        weight_version: str | None = None,
        codec: TensorCodec | None = None,
        tp_size: int = 1,
        bucket_bytes: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        """Send weights by HF name, in buckets of at most `bucket_bytes` (None: one request). The version
        and the cache flush go with the last bucket only, so no output is stamped with a half-loaded
        version. `codec`: None asks the server which payload it takes (see `codec_for`)."""
        if codec is None:
            codec = codec_for(await self.server_info())
        buckets = list(bucket_named_tensors(named_tensors, bucket_bytes))
        for index, bucket in enumerate(buckets):
            last = index == len(buckets) - 1
            body: dict[str, Any] = {
                "serialized_named_tensors": await asyncio.to_thread(codec.encode, bucket, tp_size),
                "load_format": codec.load_format,
                "flush_cache": flush_cache and last,
            }
            if last and weight_version is not None:
                body["weight_version"] = weight_version
            await self._checked("/update_weights_from_tensor", body)

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = GROUP_NAME,
        backend: str = "nccl",
    ) -> str:
        """Have the server join a trainer's weight-update group (SGLang's `InitWeightsUpdateGroupReqInput`);
        answers once it has (the trainer and every other engine join at the same time)."""
        body = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "group_name": group_name,
            "backend": backend,
        }
        return await self._checked("/init_weights_update_group", body)

    async def update_weights_from_distributed(
        self,
        metas: Sequence[TensorMeta],
        *,
        group_name: str = GROUP_NAME,
        weight_version: str | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        load_format: str | None = None,
    ) -> str:
        """Have the server receive one bucket that rank 0 broadcasts (SGLang's
        `UpdateWeightsFromDistributedReqInput`: parallel names / dtypes / shapes); answers once it is
        received and loaded. Send the version with the last bucket of a push only."""
        body: dict[str, Any] = {
            "names": [m.name for m in metas],
            "dtypes": [m.dtype for m in metas],
            "shapes": [list(m.shape) for m in metas],
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format
        return await self._checked("/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str = GROUP_NAME) -> str:
        return await self._checked("/destroy_weights_update_group", {"group_name": group_name})

    async def update_weight_version(self, version: str, *, abort_all_requests: bool = False) -> None:
        await self._checked(
            "/update_weight_version", {"new_version": version, "abort_all_requests": abort_all_requests}
        )

    async def flush_cache(self) -> None:
        await self._send("POST", "/flush_cache")

    # -- memory ------------------------------------------------------------------------------------------------------
    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Free the engine's device memory (tags: "weights", "kv_cache"; None: both)."""
        await self._send(
            "POST", "/release_memory_occupation", json={} if tags is None else {"tags": list(tags)}
        )

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._send(
            "POST", "/resume_memory_occupation", json={} if tags is None else {"tags": list(tags)}
        )


def _error_message(response: httpx.Response) -> str:
    """SGLang's error bodies: `{"error": {"message"}}`, `{"message"}`, `{success, message}` or plain text."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)
