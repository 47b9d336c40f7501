"""Webhook signatures as Standard Webhooks specifies them, checked against a computation written out here, and the
URL and address checks that keep webhooks off the platform's own network."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from scheduler.domain import webhooks as wh
from wire.jobs import JobStatus


def _independent(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret[len("whsec_") :])
    mac = hmac.new(key, msg_id.encode() + b"." + str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def test_secret_format_and_signature_match_the_spec() -> None:
    secret = wh.new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:])) >= 24
    assert wh.new_secret() != secret
    body = b'{"type":"job.succeeded","data":{"id":"job_1"}}'
    header = wh.sign(secret, "msg_abc", 1_700_000_000, body)
    assert header == _independent(secret, "msg_abc", 1_700_000_000, body)
    assert wh.verify(secret, "msg_abc", 1_700_000_000, body, f"v1,bogus {header}")
    # a changed body, id, timestamp or secret fails
    assert not wh.verify(secret, "msg_abc", 1_700_000_000, body.replace(b"succeeded", b"failed"), header)
    assert not wh.verify(secret, "msg_abd", 1_700_000_000, body, header)
    assert not wh.verify(secret, "msg_abc", 1_700_000_001, body, header)
    assert not wh.verify(wh.new_secret(), "msg_abc", 1_700_000_000, body, header)


def test_the_specs_published_test_vector() -> None:
    # the example of the Standard Webhooks specification (github.com/standard-webhooks/standard-webhooks, its
    # libraries' tests): a receiver using any of its libraries verifies our messages
    secret, msg_id, ts, body = (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
    )
    assert wh.sign(secret, msg_id, ts, body) == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_event_types_and_filters() -> None:
    assert wh.job_event_type(JobStatus.SUCCEEDED) == "job.succeeded"
    assert {"job.queued", "job.running", "job.failed", "job.cancelled"} <= wh.EVENT_TYPES
    assert wh.unknown_event_types(
        ["job.succeeded", "job.*", "job.finished", "eval.*", "eval.completed", "eval.x"]
    ) == [
        "job.finished",
        "eval.x",
    ]
    assert wh.matches(["eval.*"], "eval.completed") and not wh.matches(["job.*"], "eval.completed")
    assert wh.matches(None, "job.failed") and wh.matches([], "job.failed")
    assert wh.matches(["job.*"], "job.failed")
    assert wh.matches(["job.failed"], "job.failed") and not wh.matches(["job.succeeded"], "job.failed")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.com/x", None),
        ("http://10.0.0.5:8080/x", None),  # the address is judged at delivery
        ("ftp://example.com/x", "scheme"),
        ("mailto://me@example.com", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("https:///nohost", "no host"),
        ("https://user:pw@example.com/", "credentials"),
        ("http://example.com:99999/", "not a URL"),
    ],
)
def test_url_problems(url: str, problem: str | None) -> None:
    found = wh.url_problem(url)
    assert (found is None) if problem is None else (problem in (found or ""))


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("10.1.2.3", True),
        ("192.168.0.1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("100.64.0.1", True),  # carrier-grade NAT
        ("fe80::1%eth0", True),
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_address_problems(address: str, refused: bool) -> None:
    assert (wh.address_problem(address) is not None) == refused
