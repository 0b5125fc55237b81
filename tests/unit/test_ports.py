"""Free ports come from below the ephemeral range, one band per pytest-xdist worker, never the
same twice in a process, and never one that something holds."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from devstack import ports


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    given = [ports.free_port() for _ in range(200)]
    assert len(set(given)) == len(given)
    assert max(given) < min(ephemeral_low(), ports.LOWEST + ports.BANDS * ports.BAND)
    assert min(given) >= ports.LOWEST


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        monkeypatch.setattr(ports, "_cursor", first - ports._start - 1)  # walk it again
        assert ports.free_port() != first


@pytest.mark.parametrize(("worker", "band"), [("", 0), ("gw0", 1), ("gw1", 2), ("gw2", 3)])
def test_each_worker_walks_its_own_band(
    monkeypatch: pytest.MonkeyPatch, worker: str, band: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert ports._band() == band
