"""A throwaway RabbitMQ 4.x node, from Debian trixie's package in a chroot on this bookworm machine.

    python -m devstack.rabbitmq4 build|unmount

The chroot is built once under the project's git-ignored ``.run/rabbitmq4/chroot`` (a few
minutes, as root) and kept. The node is the same controller as the 3.x one; only where its
scripts run and how they see their paths differ.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devstack.base import ServiceError, wait_until
from devstack.rabbitmq import BIN, RabbitServer

ROOT = Path(__file__).resolve().parents[1]  # the repository: devstack/ sits at its top
CHROOT = ROOT / ".run" / "rabbitmq4" / "chroot"
SUITE, MIRROR = "trixie", "http://deb.debian.org/debian"
# Written last, inside the tree that is renamed into place: a chroot without it never existed.
MARKER = ".dispatcher-rabbitmq4-built"
# Without this the Erlang distribution port listens on every interface.
ERL_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
ENTER_S = 5.0  # `chroot` enters the tree and execs the start script in milliseconds
# What later 4.x releases default to: the management API gives no message counts (a 4.x
# container of tests/support/containers.py runs with it too).
EXTRA_CONFIG = "deprecated_features.permit.management_metrics_collection = false\n"


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below PATH, deepest first (so they can be unmounted in that order)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = Path(line.split()[1].replace("\\040", " "))
        if point == path or path in point.parents:
            found.append(point)
    return sorted(found, key=lambda point: len(point.parts), reverse=True)


def unmount(chroot: Path) -> None:
    """Lazily unmount everything below CHROOT: a process still inside cannot keep /dev there."""
    for point in mounts_under(chroot):
        subprocess.run(["umount", "-l", str(point)], check=True)


@contextlib.contextmanager
def mounts_held(chroot: Path) -> Iterator[None]:
    """The chroot's mounts to this caller alone (every thread and process of this machine):
    nodes start and stop side by side, in several test workers; one node's stop must not
    unmount /proc between another's mount and its process entering the chroot."""
    with (chroot.parent / "mounts.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def in_use(chroot: Path) -> bool:
    """Whether a process runs inside CHROOT (another session's node, say)."""
    for root in Path("/proc").glob("[0-9]*/root"):
        with contextlib.suppress(OSError):
            if Path(os.readlink(root)) == chroot:
                return True
    return False


def mount(chroot: Path, *, dev: bool = True) -> None:
    """/proc (and the host's /dev) inside CHROOT; a second call changes nothing."""
    if not os.path.ismount(chroot / "proc"):
        subprocess.run(["mount", "-t", "proc", "proc", str(chroot / "proc")], check=True)
    if dev and not os.path.ismount(chroot / "dev"):
        subprocess.run(["mount", "--bind", "/dev", str(chroot / "dev")], check=True)


@contextlib.contextmanager
def mounted(chroot: Path) -> Iterator[None]:
    mount(chroot)
    try:
        yield
    finally:
        unmount(chroot)


def discard(tree: Path) -> None:
    """Remove a (half-built) chroot; never while a mount is left in it (rmtree would walk into
    the host's /dev)."""
    if not tree.exists():
        return
    unmount(tree)
    if mounts_under(tree):
        raise ServiceError("rabbitmq4", f"{tree} still has mounts; not removing it")
    shutil.rmtree(tree)


def ensure_chroot(chroot: Path = CHROOT) -> Path:
    """Build the chroot with rabbitmq-server unless it is already there; safe after an
    interrupted build (that one is thrown away and started again)."""
    if (chroot / MARKER).exists():
        return chroot
    if os.geteuid() != 0:
        raise ServiceError("rabbitmq4", "building the chroot needs root")
    if shutil.which("debootstrap") is None:
        raise ServiceError("rabbitmq4", "debootstrap is missing: apt-get install -y debootstrap")
    building = chroot.with_name(f"{chroot.name}.building")
    discard(building)
    discard(chroot)
    building.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", SUITE, str(building), MIRROR],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    policy = building / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\n# Packages must not start services in this chroot.\nexit 101\n")
    policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
    with mounted(building):
        for apt in ("update -qq", "install -y -qq rabbitmq-server"):
            subprocess.run(
                ["chroot", str(building), "apt-get", *apt.split()],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,  # dpkg's progress; errors go to stderr
            )
    (building / MARKER).write_text(f"{SUITE} rabbitmq-server\n")
    building.rename(chroot)
    return chroot


def node_root(chroot: Path) -> Path:
    """A fresh folder inside the chroot for one node's config, data and logs."""
    tmp = chroot / "tmp"
    return Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=tmp))


class Rabbit4Server(RabbitServer):
    """RabbitServer whose scripts run inside CHROOT; its root must lie inside CHROOT too."""

    major = 4

    def __init__(
        self,
        chroot: Path,
        root: Path,
        amqp_port: int,
        mgmt_port: int,
        dist_port: int,
        nodename: str,
    ) -> None:
        if chroot not in root.parents:
            raise ValueError(f"{root} is not inside {chroot}")
        super().__init__(root, amqp_port, mgmt_port, dist_port, nodename)
        self.chroot = chroot

    def command(self, tool: str) -> list[str]:
        return ["chroot", str(self.chroot), str(BIN / tool)]

    def node_path(self, path: Path) -> str:
        return f"/{path.relative_to(self.chroot)}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **super().env,
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
            # The host's locale may not exist in the chroot; Erlang wants a UTF-8 one.
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }

    def extra_config(self) -> str:
        return EXTRA_CONFIG

    def launch(self) -> None:
        # debootstrap made the few device nodes the node uses; binding the host's /dev for the
        # whole run would only let a stray `rm -rf .run` reach it.
        with mounts_held(self.chroot):
            mount(self.chroot, dev=False)
            super().launch()
            self._wait_inside()

    def _wait_inside(self) -> None:
        """Until the node's process has entered the chroot (``in_use`` sees it from then on), or
        has exited (``wait_ready`` reports that)."""
        process = self._process
        assert process is not None

        def inside_or_gone() -> bool:
            with contextlib.suppress(OSError):
                return Path(os.readlink(f"/proc/{process.pid}/root")) == self.chroot
            return process.poll() is not None

        wait_until(inside_or_gone, ENTER_S)

    def _release(self) -> None:
        with mounts_held(self.chroot):
            if not in_use(self.chroot):
                unmount(self.chroot)

    def stop(self) -> None:
        super().stop()
        self._release()

    def kill(self) -> None:
        super().kill()
        self._release()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.rabbitmq4")
    parser.add_argument("command", choices=["build", "unmount"])
    args = parser.parse_args()
    if args.command == "build":
        print("rabbitmq4 chroot:", ensure_chroot())
    else:
        unmount(CHROOT)


if __name__ == "__main__":
    main()
