"""Ray auth tokens per pool: files of the platform's home (0600, created once), read by the worker for the
pool's launcher; the embedded `ray start` gets a path to the file, never the token."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.embedded import ray_environment
from scheduler.settings import Settings


def test_token_files_per_pool(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    assert settings.ray_token("local") is None
    path = settings.ensure_ray_token("local")
    assert path == tmp_path / "home" / "ray_tokens" / "local"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    token = settings.ray_token("local")
    assert token and len(token) == 64 and int(token, 16) >= 0
    assert settings.ensure_ray_token("local") == path and settings.ray_token("local") == token  # kept
    assert settings.ray_token("gpu-a") is None  # another pool: its own file, none yet


def test_token_dir_is_configurable_and_names_cannot_escape_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAX_RAY_TOKEN_DIR", str(tmp_path / "tokens"))
    settings = Settings(home=tmp_path / "home")
    (tmp_path / "tokens").mkdir(mode=0o700)
    (tmp_path / "tokens" / "gpu-a").write_text("abc123abc123\n")
    assert settings.ray_token("gpu-a") == "abc123abc123"
    for bad in ("../secret.key", "a/b", ".hidden", "", "/etc/passwd"):
        with pytest.raises(ValueError, match="not a pool name"):
            settings.ray_token_path(bad)


def test_ray_start_environment_names_the_file_not_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-shell")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    path = Settings(home=tmp_path).ensure_ray_token("local")
    env = ray_environment(path)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(path)
    assert "RAY_AUTH_TOKEN" not in env
    assert path.read_text().strip() not in "".join(env.values())
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # loopback only
    assert env["RAY_enable_metrics_collection"] == "0"
