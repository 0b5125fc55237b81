"""The configuration reference: one row per field of ``dispatcher.settings.Settings``."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from dispatcher.settings import Settings

INTRO = """\
# Configuration

Every option is an environment variable, read only by `dispatcher/settings.py` (pydantic-settings,
prefix `DISPATCHER_`). The defaults are the embedded configuration `make run` uses. Invalid values
stop the node at start with a message naming the variable, never echoing its value (URLs carry
passwords, `DISPATCHER_API_KEYS` carries tokens).

This page is generated from `Settings`.

| variable | type | default | meaning |
|---|---|---|---|
"""


def env_name(field: str) -> str:
    return f"DISPATCHER_{field.upper()}"


def type_name(info: FieldInfo) -> str:
    annotation = info.annotation
    if annotation is SecretStr:
        return "secret string"
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in get_args(annotation))
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "computed at start"
    default: Any = info.default
    if isinstance(default, SecretStr):
        default = default.get_secret_value()
    if isinstance(default, bool):
        default = str(default).lower()
    return f"`{default}`" if default != "" else "empty"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows() -> list[tuple[str, str, str, str]]:
    """(variable, type, default, meaning) for every field, in the order Settings declares them."""
    return [
        (env_name(name), type_name(info), default_text(info), info.description or "")
        for name, info in Settings.model_fields.items()
    ]


def render() -> str:
    table = "".join(
        f"| `{env}` | {cell(kind)} | {cell(default)} | {cell(meaning)} |\n"
        for env, kind, default, meaning in rows()
    )
    return INTRO + table
