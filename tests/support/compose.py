"""The compose files read without a Docker engine: their services, the variables they use, and
their values as compose starts them with every required variable set."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.settings import Settings

ROOT = Path(__file__).parents[2]
FILES = ("compose.yaml", "compose.ha.yaml")
# Compose's interpolation: ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message},
# ${NAME?message}, ${NAME:+other}, ${NAME+other}.
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?)([-?+])([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    kind: str  # "-" default, "?" required, "+" replacement, "" none
    colon: bool  # ":-", ":?": also when set but empty
    word: str  # the default, the message or the replacement


def loaded(name: str) -> dict[str, Any]:
    import yaml

    document: dict[str, Any] = yaml.safe_load((ROOT / name).read_text())
    return document


def services(name: str) -> dict[str, Any]:
    found: dict[str, Any] = loaded(name)["services"]
    return found


def strings(node: object) -> Iterator[str]:
    """Every string value in a loaded document (comments are gone: they are not interpolated)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def variables(text: str) -> list[Variable]:
    return [
        Variable(name, kind or "", bool(colon), word or "")
        for name, colon, kind, word in VARIABLE.findall(text)
    ]


def value_of(name: str) -> str:
    """What a test sets a required variable to: 16+ characters a token or a URL may hold."""
    return f"{name.lower().replace('_', '-')}-0123456789"


def interpolated(text: str) -> str:
    """TEXT as compose starts it with every required variable set (``value_of``) and no other:
    defaults for the rest."""

    def one(match: re.Match[str]) -> str:
        name, _, kind, word = match.groups()
        if kind == "?":
            return value_of(name)
        assert kind == "-", f"${{{name}}} is neither required nor given a default"
        return str(word)

    return VARIABLE.sub(one, text)


def dispatcher_settings(environment: dict[str, str]) -> Settings:
    """The Settings a node builds from a compose ENVIRONMENT, interpolated; only Settings' names
    pass (extra=forbid)."""
    fields: dict[str, Any] = {}
    for name, value in environment.items():
        assert name.startswith("DISPATCHER_"), name
        fields[name.removeprefix("DISPATCHER_").lower()] = interpolated(value)
    return Settings(**fields)
