"""The production image's roles (docker/entrypoint.sh) outside Docker: PostgreSQL and Redis from the
environment, migrations at start, the API serving from PostgreSQL. (No Docker engine runs here.)"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from scheduler.settings import Settings
from tests.conftest import REDIS_URL, _drop_schema, _postgres_schema_url

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def test_production_refuses_embedded_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RELAX_DATABASE_URL", "RELAX_BROKER_URL", "RELAX_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError) as err:
        Settings(environment="production")
    assert "RELAX_DATABASE_URL" in str(err.value) and "RELAX_BROKER_URL" in str(err.value)


def test_api_role_migrates_and_serves_from_postgres(tmp_path: Path) -> None:
    url, schema = _postgres_schema_url()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    admin = "rlx_" + secrets.token_urlsafe(16)
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RELAX_ENVIRONMENT": "production",
        "RELAX_DATABASE_URL": url,
        "RELAX_BROKER_URL": REDIS_URL,
        "RELAX_SECRET_KEY": secrets.token_hex(16),
        "RELAX_HOME": str(tmp_path),
        "RELAX_HOST": "127.0.0.1",
        "RELAX_PORT": str(port),
        "RELAX_API_WORKERS": "1",
        "RELAX_BOOTSTRAP_ADMIN_KEY": admin,
    }
    proc = subprocess.Popen(
        ["sh", str(ENTRYPOINT), "api"],
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / "api.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 60
        body = None
        while time.time() < deadline and proc.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert body and '"database":"postgresql"' in body, (tmp_path / "api.log").read_text()[-3000:]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/teams", headers={"Authorization": f"Bearer {admin}"}
        )
        assert b'"default"' in urllib.request.urlopen(req, timeout=5).read()
    finally:
        proc.terminate()
        proc.wait(20)
        _drop_schema(schema)
