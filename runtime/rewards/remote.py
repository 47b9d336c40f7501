"""`remote_rm`: score samples by POSTing them as JSON to `rm-url`, with bounded retries and a concurrency cap.

Protocol (the README has it in full):

- one sample: ``POST rm-url`` with ``{"prompt", "response", "label", "metadata"}`` (Relax's body is the first
  three keys; `metadata` is the sample's metadata dict). The answer is a JSON number, or a JSON object from
  which `reward-key` picks the number.
- one group (`group-rm`): ``POST rm-url`` with ``{"samples": [<one-sample body>, ...]}``; the answer is a JSON
  list with one number-or-object per sample, in order, or ``{"rewards": [...]}``.

Connection errors, timeouts, 408, 425, 429 and 5xx are retried with exponential backoff and jitter (honouring
``Retry-After``); other 4xx answers and answers that are not JSON fail at once. Every failure raises
`RemoteRewardError`, whose message names the URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.types import Sample

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class RemoteRewardError(RuntimeError):
    """The remote reward model could not score a request (after retries, or on a non-retryable answer)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How `remote_rm` retries. Attempt k (k >= 1) that fails waits a random time between half and all of
    ``min(max_delay_s, base_delay_s * 2**(k-1))`` ("equal jitter") before attempt k+1; `timeout_s` bounds each
    attempt (connect + send + read). Defaults follow Relax's remote RM: 10 attempts, delays doubling from 1 s
    to 30 s, 120 s per request."""

    max_attempts: int = 10
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be at least 1")

    def delay(self, failed_attempt: int, rng: random.Random) -> float:
        """Seconds to wait after the `failed_attempt`-th attempt failed.

        >>> policy = RetryPolicy(base_delay_s=1.0, max_delay_s=30.0)
        >>> [0.5 <= policy.delay(1, random.Random(0)) <= 1.0, 15.0 <= policy.delay(9, random.Random(0)) <= 30.0]
        [True, True]
        """
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (failed_attempt - 1))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


def sample_payload(sample: Sample, response: str | None = None) -> dict[str, Any]:
    """The JSON body for one sample; `response` replaces the sample's (``boxed_remote_rm`` sends the box).

    >>> sample_payload(Sample(index=0, group_index=0, prompt="2+2=", label="4", response="4"))
    {'prompt': '2+2=', 'response': '4', 'label': '4', 'metadata': {}}
    """
    return {
        "prompt": sample.prompt,
        "response": sample.response if response is None else response,
        "label": sample.label,
        "metadata": sample.metadata,
    }


def _retry_after_s(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None  # absent, or an HTTP date: use our own backoff


class RemoteRewardModel:
    """A client of one reward-model URL. At most `limit` requests are in flight across all its callers (a
    semaphore held per attempt, released while backing off); `client` is an open `httpx.AsyncClient`."""

    def __init__(
        self,
        url: str,
        client: httpx.AsyncClient,
        *,
        limit: asyncio.Semaphore,
        policy: RetryPolicy,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.client = client
        self.limit = limit
        self.policy = policy
        self.rng = rng or random.Random()

    async def score(self, sample: Sample, response: str | None = None) -> Any:
        """The reward model's answer for one sample: a number or a dict."""
        answer = await self.post(sample_payload(sample, response), what=f"sample {sample.index}")
        if isinstance(answer, list):
            raise RemoteRewardError(f"remote reward model at {self.url} answered a list for one sample")
        return answer

    async def score_group(self, samples: Sequence[Sample], responses: Sequence[str | None]) -> list[Any]:
        """The reward model's answers for one group, one per sample, in order."""
        body = {"samples": [sample_payload(s, r) for s, r in zip(samples, responses, strict=True)]}
        answer = await self.post(body, what=f"group {samples[0].group_index} ({len(samples)} samples)")
        if isinstance(answer, dict) and isinstance(answer.get("rewards"), list):
            answer = answer["rewards"]
        if not isinstance(answer, list) or len(answer) != len(samples):
            got = f"{len(answer)} values" if isinstance(answer, list) else type(answer).__name__
            raise RemoteRewardError(
                f"remote reward model at {self.url} answered {got} for a group of {len(samples)} samples; "
                'a group request needs a JSON list (or {"rewards": [...]}) with one value per sample'
            )
        return answer

    async def post(self, body: dict[str, Any], *, what: str) -> Any:
        content = json.dumps(body, default=str).encode("utf-8")
        headers = {"content-type": "application/json"}
        last_error = "no attempt made"
        for attempt in range(1, self.policy.max_attempts + 1):
            retry_after = None
            try:
                async with self.limit:
                    response = await self.client.post(self.url, content=content, headers=headers)
            except httpx.TransportError as exc:  # connect/read/write errors and timeouts
                last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.is_success:
                    try:
                        return response.json()
                    except ValueError:
                        raise RemoteRewardError(
                            f"remote reward model at {self.url} answered {what} with HTTP "
                            f"{response.status_code} but a body that is not JSON: {response.text[:200]!r}"
                        ) from None
                last_error = f"HTTP {response.status_code}: {response.text[:200]!r}"
                if response.status_code not in RETRYABLE_STATUS:
                    raise RemoteRewardError(
                        f"remote reward model at {self.url} refused {what} ({last_error}); not retried"
                    )
                retry_after = _retry_after_s(response)
            if attempt == self.policy.max_attempts:
                break
            delay = self.policy.delay(attempt, self.rng)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.policy.max_delay_s))
            log.info(
                "remote reward model at %s: %s on attempt %d/%d for %s; retrying in %.2fs",
                self.url,
                last_error,
                attempt,
                self.policy.max_attempts,
                what,
                delay,
            )
            await asyncio.sleep(delay)
        raise RemoteRewardError(
            f"remote reward model at {self.url} failed {what} after {self.policy.max_attempts} attempts; "
            f"last error: {last_error}"
        )


@asynccontextmanager
async def open_remote(url: str, *, concurrency: int, policy: RetryPolicy) -> AsyncIterator[RemoteRewardModel]:
    """A `RemoteRewardModel` on a fresh HTTP client (bound to the running event loop), closed on exit."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        timeout=policy.timeout_s, limits=limits, follow_redirects=True, trust_env=False
    ) as client:
        yield RemoteRewardModel(url, client, limit=asyncio.Semaphore(concurrency), policy=policy)
