"""The driver's first call: the one-time bootstrap secret for the attempt's token (runtime/bootstrap.py)."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from runtime import bootstrap, credential
from runtime.credential import BOOTSTRAP_ENV, CredentialError, exchange, take_bootstrap_secret


class Answers:
    """httpx.post replaced: answers (or raises) in order, recording each call."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, *, headers: dict[str, str], timeout: float) -> httpx.Response:
        self.calls.append((url, headers))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body, request=httpx.Request("POST", url))


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(credential.time, "sleep", lambda s: None)


def test_exchange_gets_the_attempts_token_with_the_bootstrap_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers((200, {"token": "rjt_2_" + "a" * 64, "attempt": 2}))
    monkeypatch.setattr(httpx, "post", answers)
    cred = exchange("http://api:8400/", "job_1", "rjb_2_secret")
    assert (cred.job_id, cred.attempt, cred.token) == ("job_1", 2, "rjt_2_" + "a" * 64)
    assert answers.calls == [
        ("http://api:8400/v1/internal/jobs/job_1/token", {"Authorization": "Bearer rjb_2_secret"})
    ]


def test_only_what_never_reached_the_platform_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(
        httpx.ConnectError("refused"), (503, {}), (200, {"token": "rjt_1_" + "b" * 64, "attempt": 1})
    )
    monkeypatch.setattr(httpx, "post", answers)
    assert exchange("http://api", "job_1", "rjb_1_x").attempt == 1 and len(answers.calls) == 3
    # a refusal is final: a used secret (409) or a wrong one (401) is not tried again
    for status, code in ((409, "job.bootstrap_reused"), (401, "job.bad_token")):
        answers = Answers((status, {"error": {"code": code}}))
        monkeypatch.setattr(httpx, "post", answers)
        with pytest.raises(CredentialError, match=code):
            exchange("http://api", "job_1", "rjb_1_x")
        assert len(answers.calls) == 1
    with pytest.raises(CredentialError, match="no bootstrap secret"):
        exchange("http://api", "job_1", "")


def test_the_secret_leaves_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BOOTSTRAP_ENV, "rjb_1_" + "c" * 64)
    assert take_bootstrap_secret() == "rjb_1_" + "c" * 64
    assert BOOTSTRAP_ENV not in os.environ and take_bootstrap_secret() == ""


def test_a_refused_driver_exits_1_before_its_heavy_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BOOTSTRAP_ENV, "rjb_1_used")
    monkeypatch.setattr(httpx, "post", Answers((409, {"error": {"code": "job.bootstrap_reused"}})))
    assert bootstrap.main(["--job-id", "job_1", "--api-url", "http://api"]) == 1
