"""The driver's credential: the one-time bootstrap secret of its Ray job's environment, and its exchange for the
attempt's bearer token (runtime/bootstrap.py does it first thing; design: scheduler/services/job_tokens.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from runtime.redaction import register_secret

BOOTSTRAP_ENV = "RELAX_JOB_BOOTSTRAP"
log = logging.getLogger("runtime.bootstrap")  # the entrypoint's name: its lines are the exchange
T = TypeVar("T")


@dataclass(frozen=True)
class JobCredential:
    """The attempt's bearer token (`repr` leaves it out)."""

    job_id: str
    attempt: int
    token: str = field(repr=False)

    def derive(self, purpose: str) -> str:
        """A secret for one purpose within this attempt (e.g. what the job's engine servers require of
        their callers), so that the token itself never leaves the driver: HMAC(token, purpose). Pass it
        to Ray actors as a constructor argument, which Ray's dashboard does not show
        (tests/ray/test_job_credentials.py)."""
        derived = "rjd_" + hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()
        register_secret(derived)
        return derived


class CredentialError(RuntimeError):
    """The bootstrap secret was refused (wrong, used already, or the attempt ended)."""


def take_bootstrap_secret() -> str:
    """The bootstrap secret, removed from this process's environment (so that nothing this process starts
    inherits it). Empty when there is none."""
    secret = os.environ.pop(BOOTSTRAP_ENV, "").strip()
    register_secret(secret)
    return secret


def exchange(api_url: str, job_id: str, bootstrap: str, *, deadline_s: float = 120.0) -> JobCredential:
    """`POST {api}/v1/internal/jobs/{id}/token` with the bootstrap secret: the attempt's token, once.

    Retries only what cannot have reached the platform (no connection) and its 5xx answers; a refusal
    (401: wrong secret or attempt over; 409: exchanged already, i.e. someone else holds the secret) is
    final."""
    if not bootstrap:
        raise CredentialError(
            f"no bootstrap secret in ${BOOTSTRAP_ENV}: was this driver started by the platform?"
        )
    url = f"{api_url.rstrip('/')}/v1/internal/jobs/{job_id}/token"

    def attempt() -> JobCredential:
        try:
            response = httpx.post(url, headers={"Authorization": f"Bearer {bootstrap}"}, timeout=10.0)
        except httpx.ConnectError as exc:  # never reached the platform: safe to try again
            raise Retry(f"cannot connect ({type(exc).__name__})") from exc
        if response.is_success:
            body = response.json()
            register_secret(body["token"])
            return JobCredential(job_id=job_id, attempt=int(body["attempt"]), token=str(body["token"]))
        if response.status_code < 500:
            code = _error_code(response)
            raise CredentialError(
                f"the platform refused this driver's bootstrap secret (HTTP {response.status_code} {code})"
            )
        raise Retry(f"HTTP {response.status_code}")

    return with_retries(
        attempt,
        deadline_s=deadline_s,
        what="token exchange",
        logger=log,
        give_up=lambda problem: CredentialError(f"POST {url} failed for {deadline_s:.0f}s: {problem}"),
    )


class Retry(Exception):
    """A failed attempt of `with_retries` worth another try; its text says what failed."""


def with_retries(
    attempt: Callable[[], T],
    *,
    deadline_s: float,
    what: str,
    logger: logging.Logger,
    give_up: Callable[[str], Exception],
) -> T:
    """`attempt()` until it returns or raises anything but `Retry`, for a call to the platform's internal API.

    Between tries it logs (to `logger`) that `what` failed and waits 0.5 s, doubling up to 10 s; a try that
    fails once `deadline_s` has passed raises `give_up(problem)`."""
    delay, deadline = 0.5, time.monotonic() + deadline_s
    while True:
        try:
            return attempt()
        except Retry as exc:
            problem = str(exc)
        if time.monotonic() > deadline:
            raise give_up(problem)
        logger.warning("%s failed (%s); retrying in %.1fs", what, problem, delay)
        time.sleep(delay)
        delay = min(delay * 2, 10.0)


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except Exception:  # noqa: BLE001 - any body: name none
        return ""
