"""Whether the session's services run in containers or from the system's binaries.

Stdlib only at import: the fixtures ask before they import testcontainers, so a machine without
the package (or without an engine) still runs every test on the binaries.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from pathlib import Path
from typing import Final

# binaries: never containers; containers: always, and a missing engine fails the run; unset:
# containers where an engine answers.
SERVICES: Final = "DISPATCHER_TEST_SERVICES"
CHOICES: Final = ("binaries", "containers")
# An engine answers a ping in milliseconds; a remote DOCKER_HOST that is down must not hold up
# every session start.
PING_S: Final = 3
# Where the docker SDK looks without DOCKER_HOST.
LOCAL_SOCKET: Final = "/var/run/docker.sock"


class EngineMissing(RuntimeError):
    """DISPATCHER_TEST_SERVICES=containers, but no Docker engine answers."""


def engine_answers() -> bool:
    """Whether a Docker engine answers a ping where the docker SDK looks (DOCKER_HOST, else the
    local socket). Any error, the SDK missing included, means no."""
    if not os.environ.get("DOCKER_HOST") and not Path(LOCAL_SOCKET).exists():
        return False  # nothing to ask: no socket is opened, none is left to the collector
    # A connection that fails inside the SDK leaves its socket to the garbage collector, whose
    # ResourceWarning would fail whichever test runs then (warnings are errors): collected here,
    # quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return _pinged()
        finally:
            gc.collect()


def _pinged() -> bool:
    try:
        import docker  # the `containers` dependency group

        client = docker.from_env(timeout=PING_S)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            client.close()


def use_containers() -> bool:
    """The choice the session fixtures follow (DISPATCHER_TEST_SERVICES, else the engine)."""
    choice = os.environ.get(SERVICES, "")
    if choice not in ("", *CHOICES):
        raise ValueError(f"{SERVICES}={choice!r}: expected one of {CHOICES} or unset")
    if choice == "binaries":
        return False
    if engine_answers():
        return True
    if choice == "containers":
        where = os.environ.get("DOCKER_HOST") or "the local socket"
        raise EngineMissing(f"{SERVICES}=containers, but no Docker engine answers at {where}")
    return False
