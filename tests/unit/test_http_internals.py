"""The uvicorn internals the HTTP edge overrides: the installed uvicorn is the one release the
guards were written for and pyproject.toml pins; any other release, or one where a probe misses
what the guards override, is refused with a reason naming the installed and the supported one."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement

from dispatcher import errors
from dispatcher.api import internals


def test_the_installed_uvicorn_is_the_release_the_guards_accept() -> None:
    assert metadata.version("uvicorn") == internals.TESTED_UVICORN
    assert internals.unsupported() is None
    internals.require()  # raises where a node would refuse to serve


def test_the_project_pins_uvicorn_to_the_release_the_guards_accept() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (pin,) = (
        Requirement(line)
        for line in project["project"]["dependencies"]
        if Requirement(line).name == "uvicorn"
    )
    assert str(pin.specifier) == f"=={internals.TESTED_UVICORN}"


@pytest.mark.parametrize("version", ["0.53.9", "0.54.1", "0.55.0", "1.0.0", "0.54.0rc1", "dev"])
def test_any_other_release_is_refused_naming_the_installed_and_the_supported_one(
    version: str,
) -> None:
    with pytest.raises(errors.HttpServerUnsupported) as refused:
        internals.require(uvicorn_version=version)
    assert isinstance(refused.value, errors.Fatal)
    message = str(refused.value)
    assert f"uvicorn {version} is installed" in message
    assert f"supports uvicorn {internals.TESTED_UVICORN}" in message
    assert f"install uvicorn=={internals.TESTED_UVICORN}" in message


def test_a_server_that_no_longer_takes_signals_through_capture_signals_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def serve(self: uvicorn.Server, sockets: object = None) -> None:
        await self._serve()  # a release that installs its handlers some other way

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    with pytest.raises(errors.HttpServerUnsupported, match="capture_signals"):
        internals.require()


def test_a_protocol_without_a_callback_it_overrides_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uvicorn.protocols.http import httptools_impl

    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_headers_complete")
    with pytest.raises(errors.HttpServerUnsupported, match="on_headers_complete"):
        internals.require()
