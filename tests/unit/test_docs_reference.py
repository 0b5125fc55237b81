"""The reference pages the docs generate from the code are complete: every setting with its
variable and a description, every exported metric, every command, every path of the API."""

from __future__ import annotations

import argparse
import re

from dispatcher.cli.main import build_parser
from dispatcher.metrics import Metrics
from dispatcher.settings import Settings
from tests.support.docs_hooks import hook

SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_the_configuration_page_names_every_setting_with_a_description() -> None:
    page = hook("settings_page").render()
    rows = {
        match[0]: match[1].strip()
        for match in re.findall(r"^\| `(DISPATCHER_[A-Z0-9_]+)` \|.*\| (.*) \|$", page, re.M)
    }
    expected = {f"DISPATCHER_{name.upper()}" for name in Settings.model_fields}
    assert "DISPATCHER_DATABASE_URL" in expected
    assert set(rows) == expected
    assert sorted(env for env, meaning in rows.items() if not meaning) == []


def test_the_configuration_page_shows_defaults_and_never_a_factory_value() -> None:
    page = hook("settings_page").render()
    assert "| `DISPATCHER_HTTP_PORT` | int | `8080` |" in page
    assert "| `DISPATCHER_ZK_HOSTS` | str | empty |" in page
    assert "| `DISPATCHER_NODE_ID` | str | computed at start |" in page


def test_the_metrics_page_documents_every_exported_metric() -> None:
    page = hook("metrics_page").render()
    documented = {base(name) for name in re.findall(r"^\| `(dispatcher_[a-z_]+)`", page, re.M)}
    exported = {metric.name for metric in Metrics().registry.collect()}
    assert "dispatcher_jobs_submitted" in exported
    assert exported <= documented, exported - documented


def commands(parser: argparse.ArgumentParser) -> set[str]:
    found = {parser.prog}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= commands(child)
    return found


def test_the_command_line_page_has_the_help_of_every_command() -> None:
    page = hook("cli_page").render()
    expected = commands(build_parser())
    assert {"dispatcher dlq requeue", "dispatcher keys create"} <= expected
    for prog in expected:
        assert f"## `{prog}`\n\n```text\nusage: {prog} " in page, prog


def test_the_http_api_page_has_every_path_and_method() -> None:
    openapi = hook("openapi_page")
    spec = openapi.document()
    page = openapi.render()
    operations = [
        (method, path)
        for path, item in spec["paths"].items()
        for method in item
        if method in openapi.METHODS
    ]
    assert ("post", "/v1/jobs") in operations
    for method, path in operations:
        assert f"### `{method.upper()} {path}`" in page
