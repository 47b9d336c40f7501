"""The frame every `relaxctl` command that calls the API shares (client/commands.py): the common options in one
order, an API error raised anywhere in a command becoming its message and exit code, a `Table` printed as a
table or, with --json, as the API's data."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

import client.cli as cli
import client.commands as commands
from client.display import Col
from client.sdk import ApiError


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    for name, sub in getattr(group, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def test_every_api_command_ends_with_the_common_options_in_one_order() -> None:
    common = ["--url", "--api-key", "--json", "--wide"]
    api_commands = 0
    for path, command in _commands(typer.main.get_command(cli.app)):
        flags = [p.opts[0] for p in command.params if p.opts[0].startswith("--")]
        if "--url" not in flags:
            continue
        api_commands += 1
        tail = flags[flags.index("--url") :]
        assert tail == [f for f in common if f in tail], (path, flags)
        assert tail[:2] == ["--url", "--api-key"], (path, flags)
    assert api_commands >= 25


NODE = {"name": "n1", "gpus": 2, "allocated_gpus": 0, "cordoned": False, "alive": True}


class FailingClient:
    def __init__(self, status: int) -> None:
        self.status = status

    def __enter__(self) -> FailingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def queues(self) -> list[dict[str, Any]]:
        raise ApiError(
            self.status,
            "queue.invalid",
            "no such queue",
            {"issues": [{"field": "queue", "message": "unknown", "hint": "see relaxctl queues"}]},
        )

    def pools(self) -> list[dict[str, Any]]:
        return [{"name": "p", "accelerator": "cpu", "cordoned": False, "ray_address": None, "nodes": [NODE]}]


@pytest.mark.parametrize(("status", "code"), [(422, 2), (409, 2), (500, 1), (0, 1)])
def test_an_api_error_becomes_its_message_and_exit_code(
    monkeypatch: pytest.MonkeyPatch, status: int, code: int
) -> None:
    monkeypatch.setattr(commands, "connect", lambda url, key: FailingClient(status))
    monkeypatch.setattr(commands, "err", Console(stderr=True, width=200, no_color=True))
    r = CliRunner().invoke(cli.app, ["queues"])
    assert r.exit_code == code
    assert "error no such queue  (queue.invalid)" in r.output
    assert "queue: unknown" in r.output and "hint: see relaxctl queues" in r.output


def test_a_table_prints_as_a_table_or_as_the_api_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "connect", lambda url, key: FailingClient(500))
    monkeypatch.setattr(commands, "out", Console(width=200, no_color=True))
    runner = CliRunner()
    table = runner.invoke(cli.app, ["pools"])
    header, row = table.output.splitlines()
    assert (
        table.exit_code == 0
        and header.split() == "pool node used/slots state jobs (slots) accelerator ray".split()
    )
    assert row.split() == ["p", "n1", "0/2", "CPU", "up", "-", "cpu", "-"]
    data = runner.invoke(cli.app, ["pools", "--json"])
    assert data.exit_code == 0 and '"accelerator": "cpu"' in data.output


def test_a_command_may_only_ask_for_the_options_the_frame_adds() -> None:
    def listing(c: Any, *, wide: bool) -> commands.Table:
        return commands.Table([], [Col("id")], list)

    commands.api_call("wide")(listing)
    with pytest.raises(TypeError, match="keyword-only"):
        commands.api_call("json")(listing)
