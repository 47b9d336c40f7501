"""Secret files under $RELAX_HOME: 0600 from the first byte whatever the umask, whole or absent, created once."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from scheduler.secret_files import create_secret_file, ensure_private_dir, read_secret_file
from scheduler.settings import Settings


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():  # type: ignore[no-untyped-def]
    """The most permissive umask: whatever the platform creates must not rely on the caller's."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_created_0600_from_the_first_byte_in_a_0700_home(tmp_path: Path, open_umask, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    created: list[tuple[str, int, int]] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, *a, **k):  # type: ignore[no-untyped-def]
        if flags & os.O_CREAT:
            created.append((str(path), flags, mode))
        return real_open(path, flags, mode, *a, **k)

    monkeypatch.setattr(os, "open", recording_open)
    home = tmp_path / "home"
    assert create_secret_file(home / "admin.key", "rlx_secret\n") is True
    assert _mode(home / "admin.key") == 0o600 and _mode(home) == 0o700
    assert (home / "admin.key").read_text() == "rlx_secret\n"
    # every file it created was created exclusively, and 0600 by the open itself (no chmod afterwards)
    assert created and all(flags & os.O_EXCL and mode == 0o600 for _, flags, mode in created)
    assert sorted(p.name for p in home.iterdir()) == ["admin.key"]  # no temporary file left


def test_the_first_creator_wins_and_others_keep_its_content(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(create_secret_file(path, f"value-{i}")))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert read_secret_file(path).startswith("value-") and _mode(path) == 0o600


def test_signing_key_and_an_old_world_readable_key_file(tmp_path: Path, open_umask) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(home=tmp_path / "h")
    key = settings.signing_key()
    assert len(key) == 64 and _mode(tmp_path / "h" / "secret.key") == 0o600
    assert settings.signing_key() == key
    assert "secret_key" not in repr(Settings(home=tmp_path, secret_key="rlx_do_not_print_me"))
    legacy = tmp_path / "legacy.key"
    legacy.write_text("x\n")
    legacy.chmod(0o644)
    assert read_secret_file(legacy) == "x" and _mode(legacy) == 0o600


def test_a_home_open_to_others_is_narrowed(tmp_path: Path) -> None:
    home = tmp_path / "wide"
    home.mkdir()
    home.chmod(0o755)
    ensure_private_dir(home)
    assert _mode(home) == 0o700
