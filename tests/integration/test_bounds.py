"""Bounds everywhere (issue 11 item 4), over the app on SQLite and PostgreSQL: every case that fuzzing the
running platform found is a test here. Every number in specs, admin objects and query parameters has a
range the schema states; bodies, key counts and nesting are limited; NUL characters are refused before
the database; validation holds no write lock; no input reaches a 500."""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

import sqlalchemy as sa

from jobspec.bounds import MAX_GPUS_PER_NODE, MAX_JSON_DEPTH, MAX_PATH_LENGTH, MAX_SPEC_KEYS
from scheduler.services.lifecycle import JobLifecycle
from scheduler.settings import ApiSettings
from tests.factories import grpo_spec
from tests.integration.test_api import TINY_ARGS, _driver_headers

BIG = 2**63  # one past the largest 64-bit integer
JSON = {"content-type": "application/json"}


def _issues(r: Any) -> list[dict[str, Any]]:
    return r.json()["error"]["details"]["issues"]


def _refused(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["request_id"], error
    return error


def test_rollout_batch_size_1e100_is_refused_at_submission(api) -> None:  # type: ignore[no-untyped-def]
    """Accepted before, and its driver grew to 2.5 GB: now 422 naming the flag, with the range as hint."""
    client, _, _ = api
    args = list(TINY_ARGS)
    args[args.index("--rollout-batch-size") + 1] = str(10**100)
    for body in ({"spec": grpo_spec(**{"rollout-batch-size": 10**100})}, {"args": args}):
        error = _refused(client.post("/v1/jobs", json=body), 422, "spec.invalid")
        (issue,) = [i for i in error["details"]["issues"] if i["severity"] == "error"]
        assert (issue["code"], issue["field"]) == ("spec.out_of_range", "rollout-batch-size")
        assert "<= 2147483647" in issue["hint"]
        dry = client.post("/v1/specs/validate", json=body).json()
        assert not dry["valid"] and [e["code"] for e in dry["errors"]] == ["spec.out_of_range"]
    # a JSON float is not an integer at all
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**{"rollout-batch-size": 1e100})})
    assert _issues(r)[0]["field"] == "rollout-batch-size"
    assert client.get("/v1/jobs").json()["data"] == []


def test_node_gpus_and_every_admin_number_have_a_range(api) -> None:  # type: ignore[no-untyped-def]
    """A node of 2^63-1 GPUs made the scheduling pass allocate until its worker reached 16.6 GB: a node has
    at most MAX_GPUS_PER_NODE, as the schema says; 2^63 and beyond are 422 too, never a 500."""
    client, _, _ = api
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["NodeCreate"]["properties"]["gpus"]["maximum"] == MAX_GPUS_PER_NODE
    for gpus in (BIG - 1, BIG, MAX_GPUS_PER_NODE + 1, -1):
        r = client.put("/v1/pools/local/nodes/n1", json={"name": "n1", "gpus": gpus})
        assert _refused(r, 422, "request.invalid")["details"]["issues"][0]["field"] == "gpus"
        r = client.patch("/v1/pools/local/nodes/node-0", json={"gpus": gpus})
        _refused(r, 422, "request.invalid")
        r = client.post(
            "/v1/pools", json={"name": "p2", "accelerator": "h200", "nodes": [{"name": "a", "gpus": gpus}]}
        )
        _refused(r, 422, "request.invalid")
    ok = client.put("/v1/pools/local/nodes/n1", json={"name": "n1", "gpus": MAX_GPUS_PER_NODE})
    assert ok.status_code == 200 and ok.json()["total_gpus"] == MAX_GPUS_PER_NODE + 2
    queue = {"name": "q2", "pool": "local", "team": "default", "nominal_gpus": 1}
    refused = [
        ("POST", "/v1/queues", {**queue, "nominal_gpus": BIG}),
        ("POST", "/v1/queues", {**queue, "borrowing_limit": BIG}),
        ("POST", "/v1/queues", {**queue, "lending_limit": BIG - 1}),
        ("POST", "/v1/queues", {**queue, "weight": 1e308}),
        ("PATCH", "/v1/queues/default", {"nominal_gpus": BIG}),
        ("PATCH", "/v1/queues/default", {"weight": 0}),
        ("POST", "/v1/priority-classes", {"name": "x", "value": BIG}),
        ("POST", "/v1/api-keys", {"name": "k", "role": "member", "team": "default", "expires_in_days": BIG}),
        ("POST", "/v1/pools", {"name": "p3", "accelerator": "a" * 41}),
        ("PATCH", "/v1/pools/local", {"ray_address": "http://" + "a" * 300}),
    ]
    for method, path, body in refused:
        _refused(client.request(method, path, json=body), 422, "request.invalid")
    assert client.post("/v1/queues", json=queue).status_code == 201


def test_integer_query_parameters_state_a_range_and_2_63_is_422(api) -> None:  # type: ignore[no-untyped-def]
    """Integers >= 2^63 in query parameters gave a 500 (SQLite cannot bind them). Every integer parameter of
    every route states its range in the OpenAPI document, and one beyond it is a 422 in the envelope."""
    client, _, _ = api
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
    checked = 0
    for path, item in client.get("/openapi.json").json()["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                schema = param["schema"]
                options = schema.get("anyOf", [schema])
                if not any(o.get("type") in ("integer", "number") for o in options):
                    continue
                number = next(o for o in options if o.get("type") in ("integer", "number"))
                assert {"minimum", "maximum"} <= set(number), (path, param["name"], number)
                if method != "get" or param["in"] != "query":
                    continue
                url = path.replace("{job_id}", job).replace("{fine_tuning_job_id}", job)
                # OpenAI's fine-tuning routes answer a refusal 400 in OpenAI's error shape, the field as `param`
                openai_shape = path.startswith("/v1/fine_tuning/")
                for value in (BIG, number["maximum"] + 1, number["minimum"] - 1):
                    r = client.get(url, params={param["name"]: value})
                    error = _refused(r, 400 if openai_shape else 422, "request.invalid")
                    assert error["details"]["issues"][0]["field"] == param["name"]
                    assert not openai_shape or error["param"] == param["name"]
                checked += 1
    assert checked >= 5  # jobs: limit; logs: after, limit, tail; metrics: since_step; audit: after, limit


def test_deep_json_and_non_finite_numbers_are_refused(api) -> None:  # type: ignore[no-untyped-def]
    """1,000-deep JSON in `--resource` gave a 500 (RecursionError); in a body, a parse error. NaN, which
    Python's parser reads but PostgreSQL's JSON refuses, is refused too (inside a string it is text)."""
    client, _, _ = api
    deep = "[" * 1000 + "1" + "]" * 1000
    dry = client.post("/v1/specs/validate", json={"args": ["--resource", '{"actor": ' + deep + "}"]})
    assert dry.status_code == 200 and ("spec.invalid_json", "resource") in {
        (e["code"], e["field"]) for e in dry.json()["errors"]
    }
    for depth in (1000, MAX_JSON_DEPTH + 1):
        body = '{"spec": {"resource": {"actor": ' + "[" * depth + "]" * depth + "}}}"
        for path in ("/v1/specs/validate", "/v1/jobs"):
            error = _refused(client.post(path, content=body, headers=JSON), 422, "request.invalid")
            assert error["details"]["issues"][0]["code"] == "request.too_deep"
    body = '{"spec": {"rollout-batch-size": 4}, "launch_script": {"runtime_env": {"x": NaN}}}'
    error = _refused(client.post("/v1/jobs", content=body, headers=JSON), 422, "request.invalid")
    assert error["details"]["issues"][0]["code"] == "request.non_finite_number"
    assert (
        client.post("/v1/jobs", json={"spec": grpo_spec(), "labels": {"NaN": "-Infinity"}}).status_code == 201
    )
    # the platform's own limit is not reached by a spec's JSON parameters within theirs
    r = client.post(
        "/v1/specs/validate", json={"spec": grpo_spec(**{"apply-chat-template-kwargs": {"a": {"b": [[1]]}}})}
    )
    assert r.status_code == 200 and r.json()["valid"], r.text


def test_nul_characters_are_refused_before_the_database(api) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL refuses NUL in text, which gave a 500: a NUL anywhere in a request is a 422; in a driver's
    report (a process's output, not a request to judge) it is replaced by U+FFFD."""
    client, settings, _ = api
    cases = [
        ("POST", "/v1/jobs", {"json": {"spec": grpo_spec(**{"prompt-data": "artifacts://data/\x00.jsonl"})}}),
        ("POST", "/v1/jobs", {"json": {"spec": grpo_spec(), "labels": {"a": "b\x00"}}}),
        ("POST", "/v1/teams", {"json": {"name": "a\x00"}}),
        ("POST", "/v1/specs/validate", {"json": {"args": ["--lr", "1\x00"]}}),
        ("GET", "/v1/jobs", {"params": {"name": "a\x00b"}}),
        ("GET", "/v1/jobs/job_%00", {}),
        ("POST", "/v1/jobs", {"json": {"spec": grpo_spec()}, "headers": {"Idempotency-Key": "k\x00"}}),
    ]
    for method, path, kw in cases:
        error = _refused(client.request(method, path, **kw), 422, "request.invalid")
        assert error["details"]["issues"][0]["code"] == "request.nul_character", (path, kw)
    assert client.get("/v1/jobs").json()["data"] == []
    # an escaped backslash before "u0000" is text, not a NUL
    r = client.post("/v1/jobs", json={"spec": grpo_spec(), "labels": {"a": "\\u0000"}})
    assert r.status_code == 201 and r.json()["labels"] == {"a": "\\u0000"}
    job = r.json()["id"]
    with client.app.state.db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job, "ADMITTED", expected_from="QUEUED", reason="test")
        svc.transition(job, "STARTING", expected_from="ADMITTED", reason="test")
    report = {"attempt": 1, "seq": 0, "logs": [{"time": 1e9, "level": "INFO", "message": "bin\x00ary"}]}
    r = client.post(
        f"/v1/internal/jobs/{job}/report", json=report, headers=_driver_headers(client, settings, job)
    )
    assert r.status_code == 200, r.text
    assert client.get(f"/v1/jobs/{job}/logs").json()["data"][0]["message"] == "bin\ufffdary"


def test_long_paths_are_refused_with_their_limit(api) -> None:  # type: ignore[no-untyped-def]
    """100,000-character artifact paths gave a 500 (ENAMETOOLONG from the file system)."""
    client, _, _ = api
    long = "artifacts://" + "a" * 100_000
    error = _refused(
        client.post("/v1/jobs", json={"spec": grpo_spec(**{"prompt-data": long})}), 422, "spec.invalid"
    )
    issue = error["details"]["issues"][0]
    assert (issue["code"], issue["field"]) == ("spec.bad_path", "prompt-data")
    assert str(MAX_PATH_LENGTH) in issue["message"]
    # within PATH_MAX, but a name longer than the file system's NAME_MAX (255)
    r = client.post("/v1/jobs", json={"spec": grpo_spec(**{"prompt-data": "artifacts://" + "a" * 300})})
    assert _refused(r, 422, "spec.invalid")["details"]["issues"][0]["field"] == "prompt-data"
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
    r = client.get(f"/v1/jobs/{job}/artifacts/" + "a" * 60_000)  # (the client's own limit is 64 KiB)
    assert _refused(r, 422, "request.invalid")["details"]["issues"][0]["field"] == "path"
    _refused(client.get(f"/v1/jobs/{job}/artifacts/" + "a" * 300), 404, "artifact.not_found")
    r = client.post(
        "/v1/admin/path-grants", json={"team": "default", "path": "/data/" + "a" * 300, "mode": "ro"}
    )
    assert r.status_code == 422, r.text


def test_request_bodies_and_key_counts_are_limited(api) -> None:  # type: ignore[no-untyped-def]
    """A body over the limit is a 413 before it is read whole; a spec of more keys than any spec has is a
    422 before it is judged (120,000 unknown keys took 71 s)."""
    client, settings, _ = api
    limit = settings.api.max_body_bytes
    assert limit == ApiSettings().max_body_bytes == 1024 * 1024
    big = json.dumps({"spec": grpo_spec(**{"sglang-x": "a" * limit})})
    error = _refused(client.post("/v1/jobs", content=big, headers=JSON), 413, "request.too_large")
    assert str(limit) in error["message"]

    def chunks():  # type: ignore[no-untyped-def]  # no Content-Length: counted as it arrives
        yield b'{"spec": {"x": "'
        for _ in range(limit // 65536 + 1):
            yield b"a" * 65536
        yield b'"}}'

    _refused(client.post("/v1/specs/validate", content=chunks(), headers=JSON), 413, "request.too_large")
    many = {"spec": {f"unknown-{i}": 1 for i in range(MAX_SPEC_KEYS + 1)}}
    for path in ("/v1/specs/validate", "/v1/jobs"):
        error = _refused(client.post(path, json=many), 422, "request.invalid")
        assert error["details"]["issues"][0]["field"] == "spec"
    r = client.post("/v1/specs/validate", json={"args": ["--x"] * 100_000})
    assert _refused(r, 422, "request.invalid")["details"]["issues"][0]["field"].startswith("args")
    # refused calls are audited like any other
    audit = client.get("/v1/admin/audit", params={"path": "/v1/jobs"}).json()["data"]
    assert 413 in {a["status_code"] for a in audit}


def _write_lock_probe(db, pids: set[int]) -> str | None:  # type: ignore[no-untyped-def]
    """Why another writer could not write now, or None. SQLite: a write transaction of our own with no
    busy timeout; PostgreSQL: an open transaction of the app's connections (`pids`) that has written."""
    url = db.engine.url
    if url.get_backend_name() == "sqlite":
        conn = sqlite3.connect(url.database, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return None
        except sqlite3.OperationalError as err:
            return str(err)
        finally:
            conn.close()
    with db.engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid = ANY(:pids)"
        writers = conn.execute(sa.text(query), {"pids": sorted(pids)}).scalar()
    return f"{writers} transaction(s) have written" if writers else None


def test_validation_holds_no_write_lock(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A validate request with 120,000 unknown keys held SQLite's write lock for 71 s, so other writes
    failed: the spec is judged outside any write transaction (the audit row, the job row come after)."""
    import scheduler.services.submission as jobs_module

    client, _, _ = api
    db = client.app.state.db
    pids: set[int] = set()
    if db.engine.url.get_backend_name() == "postgresql":
        sa.event.listen(db.engine, "connect", lambda conn, _: pids.add(conn.info.backend_pid))
        db.engine.dispose()  # every connection from now on is seen
    seen: list[str | None] = []
    real = jobs_module.jobspec.normalize

    def normalize(*args: Any, **kw: Any) -> Any:
        t = threading.Thread(target=lambda: seen.append(_write_lock_probe(db, pids)))
        t.start()  # from another thread, as another request would
        t.join()
        return real(*args, **kw)

    monkeypatch.setattr(jobs_module.jobspec, "normalize", normalize)
    assert client.post("/v1/specs/validate", json={"spec": grpo_spec()}).json()["valid"]
    assert client.post("/v1/jobs", json={"spec": grpo_spec()}).status_code == 201
    assert seen == [None, None], seen
    # and both calls were audited, each in a short write of its own or with the job
    paths = [a["path"] for a in client.get("/v1/admin/audit").json()["data"]]
    assert paths[:2] == ["/v1/jobs", "/v1/specs/validate"]
