"""What RelaxClient sends: the optional fields and query parameters only when given."""

from __future__ import annotations

import json
from typing import Any

import httpx

from client.sdk import ApiError, RelaxClient


def _client(sent: list[httpx.Request], answer: dict[str, Any]) -> RelaxClient:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=answer)

    client = RelaxClient("http://relax.test", "k")
    client._http = httpx.Client(base_url="http://relax.test", transport=httpx.MockTransport(handler))
    return client


def _body(request: httpx.Request) -> Any:
    return json.loads(request.content)


def test_optional_fields_are_sent_only_when_given() -> None:
    sent: list[httpx.Request] = []
    c = _client(sent, {"series": {}})
    c.submit_job(args=["--lr", "1e-6"], queue="q", idempotency_key="once")
    c.submit_job(spec={"lr": 1e-6}, name="n", team="t", priority_class="high", labels={"a": "b"})
    c.validate_spec(spec={"lr": 1e-6})
    c.validate_spec(args=[], queue="q", launch_script={"path": "x.sh"})
    c.create_api_key("ci")
    c.create_api_key("ci", "viewer", "math", expires_in_days=30, expires_at="2027-01-01T00:00:00Z")
    assert [_body(r) for r in sent[:6]] == [
        {"labels": {}, "args": ["--lr", "1e-6"], "queue": "q"},
        {"labels": {"a": "b"}, "spec": {"lr": 1e-6}, "name": "n", "team": "t", "priority_class": "high"},
        {"spec": {"lr": 1e-6}},
        {"args": [], "queue": "q", "launch_script": {"path": "x.sh"}},
        {"name": "ci", "role": "member", "team": None},
        {
            "name": "ci",
            "role": "viewer",
            "team": "math",
            "expires_in_days": 30,
            "expires_at": "2027-01-01T00:00:00Z",
        },
    ]
    assert sent[0].headers["idempotency-key"] == "once" and "idempotency-key" not in sent[1].headers
    c.metrics("job-1")
    c.metrics("job-1", names=[], since_step=0)
    c.metrics("job-1", names=["train/loss", "rollout/reward"], since_step=3)
    assert [dict(r.url.params) for r in sent[6:]] == [
        {},
        {"since_step": "0"},
        {"names": "train/loss,rollout/reward", "since_step": "3"},
    ]


def test_an_error_answer_is_read_the_same_by_every_call() -> None:
    """`ApiError.of`: the platform's envelope whole; a body that is not one (a proxy's page, JSON of another
    shape) as its text, for a plain call and for a job's stream alike."""
    answers = iter(
        [
            httpx.Response(
                404, json={"error": {"code": "job.not_found", "message": "no job x", "request_id": "r1"}}
            ),
            httpx.Response(502, text="<html>bad gateway</html>"),
            httpx.Response(503, json={"detail": "down"}),
        ]
    )
    client = RelaxClient("http://relax.test", "k")
    client._http = httpx.Client(
        base_url="http://relax.test", transport=httpx.MockTransport(lambda request: next(answers))
    )
    errors = []
    for call in (lambda: client.get_job("x"), lambda: list(client.stream("x")), lambda: client.get_job("x")):
        try:
            call()
        except ApiError as e:
            errors.append((e.status, e.code, e.message, e.request_id))
    assert errors == [
        (404, "job.not_found", "no job x", "r1"),
        (502, "http_error", "<html>bad gateway</html>", None),
        (503, "http_error", '{"detail":"down"}', None),
    ]
