"""The uvicorn internals the HTTP edge overrides are used only on the releases tested with them
and where the probes find them; otherwise the node serves with uvicorn's stock behaviour, and
says why."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement

from dispatcher.api import connections, internals

PROBES = (internals.protocol_supported, internals.signals_supported)


def limits() -> connections.Limits:
    return connections.Limits(
        max_connections=10,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        write_timeout_s=1.0,
        send_buffer_bytes=0,
        unsent=connections.unsent_budget(1024 * 1024, 1.0),
        refused=lambda reason: None,
    )


def test_the_installed_uvicorn_is_inside_the_tested_range_and_passes_the_probes() -> None:
    for probe in PROBES:
        assert probe() is None, probe.__name__
    protocol = connections.http_protocol(limits())
    assert isinstance(protocol, type)
    assert issubclass(protocol, connections.GuardedProtocol)


@pytest.mark.parametrize("version", ["0.53.9", "0.54.1", "0.55.0", "1.0.0", "0.54.0rc1", "dev"])
def test_a_release_outside_the_tested_range_gives_the_reason(version: str) -> None:
    for probe in PROBES:
        reason = probe(uvicorn_version=version)
        assert reason is not None
        assert version in reason


def test_an_untested_release_serves_with_the_stock_protocol_and_logs_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(internals, "TESTED_UVICORN", ((0, 1, 0), (0, 1, 0)))
    with caplog.at_level(logging.WARNING, logger=connections.__name__):
        assert connections.http_protocol(limits()) == "httptools"
    assert "stock protocol" in caplog.text
    assert uvicorn.__version__ in caplog.text


def test_a_server_that_no_longer_takes_signals_through_capture_signals_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def serve(self: uvicorn.Server, sockets: object = None) -> None:
        await self._serve()  # a release that installs its handlers some other way

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    reason = internals.signals_supported()
    assert reason is not None
    assert "capture_signals" in reason


def test_a_protocol_without_a_callback_it_overrides_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uvicorn.protocols.http import httptools_impl

    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_headers_complete")
    reason = internals.protocol_supported()
    assert reason is not None
    assert "on_headers_complete" in reason


def test_the_uvicorn_pin_admits_the_tested_releases_and_no_later_minor() -> None:
    """An install from the project's requirements gets the guarded protocol: the pin and the
    tested range move together."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (pin,) = (
        Requirement(line)
        for line in project["project"]["dependencies"]
        if Requirement(line).name == "uvicorn"
    )
    low, high = (".".join(map(str, version)) for version in internals.TESTED_UVICORN)
    assert pin.specifier.contains(low)
    assert pin.specifier.contains(high)
    next_minor = f"{internals.TESTED_UVICORN[1][0]}.{internals.TESTED_UVICORN[1][1] + 1}.0"
    assert not pin.specifier.contains(next_minor)
