"""`remote_rm` against a real HTTP server on localhost: protocol, retries, failures, concurrency, group-rm."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from runtime.rewards import REWARD_DETAIL_KEY, RemoteRewardError, RetryPolicy, RewardModel
from runtime.types import Sample

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, timeout_s=5.0)


def _sample(response: str, label: Any = None, *, index: int = 0, group: int = 0, **metadata: Any) -> Sample:
    return Sample(
        index=index, group_index=group, prompt="q", label=label, response=response, metadata=dict(metadata)
    )


def _remote(url: str, *, retry: RetryPolicy = FAST, **values: Any) -> RewardModel:
    return RewardModel.from_spec({"rm_type": "remote_rm", "rm_url": url, **values}, retry=retry)


def test_posts_relax_payload_and_reads_number_or_dict(rm_server) -> None:
    samples = [_sample("4", "4", source="unit"), _sample("5", "4", index=1)]
    assert _remote(rm_server.url).score(samples) == [1.0, 0.0]  # dict answer, no key: its "score"
    first = next(body for body in rm_server.requests if body["response"] == "4")  # requests are concurrent
    assert first == {
        "prompt": "q",
        "response": "4",
        "label": "4",
        "metadata": {"source": "unit"},
    }
    assert samples[0].metadata[REWARD_DETAIL_KEY] == {"score": 1.0, "length": 1}

    assert _remote(rm_server.url, reward_key="length").score(samples) == [1.0, 1.0]
    rm_server.answer = lambda body: 0.25  # a bare JSON number
    assert _remote(rm_server.url, reward_key="length").score(samples) == [0.25, 0.25]


def test_retries_until_the_flaky_server_answers(rm_server) -> None:
    rm_server.fail_first = 3  # 503 three times, then fine: the 4th attempt of the first request succeeds
    assert _remote(rm_server.url).score([_sample("a", "a")]) == [1.0]
    assert len(rm_server.requests) == 4


def test_timeouts_are_retried(rm_server) -> None:
    rm_server.hang_first, rm_server.hang_s = 1, 2.0  # the first request outlives the client's timeout
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, timeout_s=0.5)
    assert _remote(rm_server.url, retry=retry).score([_sample("a", "a")]) == [1.0]
    assert len(rm_server.requests) >= 2


def test_permanent_failure_raises_naming_the_url(rm_server) -> None:
    rm_server.fail_first, rm_server.fail_status = 1000, 500
    with pytest.raises(
        RemoteRewardError, match=rf"at {rm_server.url} failed sample 7 after 4 attempts.*HTTP 500"
    ):
        _remote(rm_server.url).score([_sample("a", "a", index=7)])
    assert len(rm_server.requests) == 4  # bounded


def test_client_errors_are_not_retried(rm_server) -> None:
    rm_server.fail_first, rm_server.fail_status = 1000, 422
    with pytest.raises(
        RemoteRewardError, match=rf"at {rm_server.url} refused sample 0 \(HTTP 422.*not retried"
    ):
        _remote(rm_server.url).score([_sample("a", "a")])
    assert len(rm_server.requests) == 1


def test_unreachable_server_raises_naming_the_url() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/score"
    retry = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.01, timeout_s=1.0)
    with pytest.raises(RemoteRewardError, match=rf"at {url} failed sample 0 after 2 attempts.*ConnectError"):
        _remote(url, retry=retry).score([_sample("a", "a")])


def test_concurrency_limit_is_respected(rm_server) -> None:
    rm_server.delay_s = 0.05
    samples = [_sample(str(i % 2), "1", index=i) for i in range(24)]
    assert _remote(rm_server.url, reward_max_concurrency=3).score(samples) == [
        float(i % 2) for i in range(24)
    ]
    assert len(rm_server.requests) == 24
    assert 2 <= rm_server.max_in_flight <= 3  # parallel, never past the limit


def test_group_rm_posts_each_group_once(rm_server) -> None:
    samples = [_sample(str(i), "2", index=i, group=i // 3) for i in range(6)]
    model = _remote(rm_server.url, group_rm=True)
    assert model.score(samples) == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    sent = sorted([s["response"] for s in body["samples"]] for body in rm_server.requests)  # concurrent
    assert sent == [["0", "1", "2"], ["3", "4", "5"]]

    rm_server.answer = lambda body: {"rewards": [0.5] * len(body["samples"])}
    assert model.score(samples) == [0.5] * 6
    rm_server.answer = lambda body: [1.0]
    with pytest.raises(RemoteRewardError, match="answered 1 values for a group of 3 samples"):
        model.score(samples)


def test_metadata_routes_some_samples_to_the_remote_model(rm_server) -> None:
    model = RewardModel.from_spec({"rm_type": "math", "rm_url": rm_server.url}, retry=FAST)
    samples = [
        _sample(r"\boxed{3}", "3"),
        _sample(r"answer \boxed{ok}", "ok", index=1, rm_type="boxed_remote_rm"),
    ]
    assert model.score(samples) == [1.0, 1.0]
    assert [body["response"] for body in rm_server.requests] == ["ok"]  # only the box is sent
