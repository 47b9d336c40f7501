"""No secret in a log line, a job log or an error message: `runtime.redaction`."""

from __future__ import annotations

import io
import logging

import pytest

from runtime.redaction import install_log_redaction, redact, redact_value, register_secret

API_KEY = "rlx_" + "A1b2C3d4" * 5 + "xyz"
TOKEN = "rjt_3_" + "ab" * 32
BOOTSTRAP = "rjb_3_" + "cd" * 32


@pytest.mark.parametrize(
    "text",
    [
        f"key {API_KEY} done",
        f"Authorization: Bearer {TOKEN}",
        f"{{'authorization': 'Bearer {API_KEY}'}}",
        "authorization=Basic dXNlcjpwYXNzd29yZA==",
        f"env RELAX_JOB_BOOTSTRAP={BOOTSTRAP} RAY_AUTH_TOKEN='0123456789abcdef' RELAX_SECRET_KEY: s3cr3tvalue",
        "postgresql+psycopg://relax:pa55word@db:5432/relax",
        f"unknown parameter '{API_KEY.replace('_', '-')}'",  # the spec's key normalisation
    ],
)
def test_secrets_are_masked(text: str) -> None:
    clean = redact(text)
    assert "[redacted]" in clean
    for secret in (
        API_KEY,
        TOKEN,
        BOOTSTRAP,
        "dXNlcjpwYXNzd29yZA",
        "0123456789abcdef",
        "s3cr3tvalue",
        "pa55word",
    ):
        assert secret not in clean and secret.replace("_", "-") not in clean


def test_ordinary_text_is_left_alone() -> None:
    for text in (
        "rollout/reward step 3: 0.42 (relax_grpo, tokenizer, RAY_ADDRESS=http://127.0.0.1:8265)",
        "GET /v1/jobs/job_0190a/metrics HTTP/1.1 200",
        "sha256 " + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ):
        assert redact(text) == text
    assert redact_value({"a": [f"x {TOKEN}", 3, None], "b": (1,)}) == {
        "a": ["x rjt_[redacted]", 3, None],
        "b": (1,),
    }


def test_registered_values_are_masked_whatever_their_shape() -> None:
    register_secret("9f8e7d6c5b4a39281706f5e4d3c2b1a0")
    register_secret("short")  # too short to mask safely: ignored
    assert redact("key=9f8e7d6c5b4a39281706f5e4d3c2b1a0;") == "key=[redacted];"
    assert redact("a short word") == "a short word"


def test_every_log_record_of_the_process_is_redacted() -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger("uvicorn.access.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        # uvicorn's access log formats its arguments itself: they stay a 5-tuple, the path redacted
        records: list[logging.LogRecord] = []
        capture = logging.Handler()
        capture.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(capture)
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/x?key={API_KEY}", "1.1", 200)
        assert len(records[0].args) == 5 and records[0].args[4] == 200  # type: ignore[arg-type, index]
        logger.warning("driver said %s", RuntimeError(f"bad token {TOKEN}"))
        try:
            raise ValueError(f"Authorization: Bearer {BOOTSTRAP}")
        except ValueError:
            logger.exception("request failed")
        logger.info({"headers": {"Authorization": f"Bearer {API_KEY}"}})
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    for secret in (API_KEY, TOKEN, BOOTSTRAP):
        assert secret not in out
    assert out.count("[redacted]") >= 4 and "ValueError" in out


def test_the_driver_ships_no_secret_in_its_log_lines_or_events(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from runtime.reporter import EventKind, LocalReporter

    reporter = LocalReporter(tmp_path, stream=io.StringIO())
    reporter.log("INFO", f"calling with Authorization: Bearer {TOKEN}", source="actor:train")
    reporter.event(EventKind.FAILED, f"HTTPError: 401 for {BOOTSTRAP}")
    assert reporter.close(timeout=10)
    shipped = (tmp_path / "reports.jsonl").read_text()
    assert TOKEN not in shipped and BOOTSTRAP not in shipped and shipped.count("[redacted]") == 2


def test_the_drivers_credential_keeps_its_token_out_of_reprs_and_derives_per_purpose_secrets() -> None:
    from runtime.credential import JobCredential

    cred = JobCredential(job_id="job_1", attempt=3, token=TOKEN)
    assert TOKEN not in repr(cred) and "job_1" in repr(cred)
    engine = cred.derive("engine-servers")
    assert engine.startswith("rjd_") and engine != cred.derive("other") and TOKEN not in engine
    assert engine == JobCredential(job_id="job_1", attempt=3, token=TOKEN).derive("engine-servers")
    assert redact(f"x-api-key {engine}") == "x-api-key rjd_[redacted]"
