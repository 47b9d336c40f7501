"""Name-keyed registries: the seam through which algorithms, rewards and backends are added."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that no entry of a registry answers to; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a readable sentence
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps a name (usually a `StrEnum` member) to an implementation.

    Registering a name twice raises, so two modules cannot silently fight over one name;
    looking up a missing name raises `UnknownNameError` listing every valid name.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str | StrEnum, *aliases: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            for key in (str(name), *map(str, aliases)):
                if key in self._entries:
                    raise ValueError(f"{self.kind} {key!r} is already registered")
                self._entries[key] = entry
            return entry

        return decorator

    def get(self, name: str | StrEnum) -> T:
        key = str(name)
        try:
            return self._entries[key]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {key!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return str(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
