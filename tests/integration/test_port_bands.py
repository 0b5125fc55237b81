"""Ports from bands (devstack/ports.py): no two processes, nor one process twice, are handed one
port, and no kernel-chosen port can be one of them."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys

from devstack import cluster_ha, ports, rabbitmq, stack
from devstack.__main__ import CLUSTER_HTTP_PORTS
from tests.support.process import ROOT

# Waits for a line on stdin, then takes 300 ports and its rabbitmqctl range, and prints them.
ASKER = """
import json, sys
from devstack import ports, rabbitmq
sys.stdin.readline()
singles = [ports.reserve_port() for _ in range(300)]
ctl = rabbitmq.ctl_ports()
print(json.dumps({"ports": [*singles, *ctl], "bands": ports.held_bands()}), flush=True)
sys.stdin.readline()
"""


def askers(count: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", ASKER],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]


def test_processes_asking_at_once_never_get_one_port() -> None:
    started = askers(3)
    for process in started:  # all of them wait for this line: they ask at once
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    # Every asker lives until all have answered: a band is free again once its holder exits.
    answers = []
    for process in started:
        assert process.stdout is not None
        answers.append(json.loads(process.stdout.readline()))
    for process in started:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.close()
        assert process.wait(30) == 0
        process.stdout.close()

    handed = [port for answer in answers for port in answer["ports"]]
    assert len(handed) == 3 * (300 + rabbitmq.CTL_PORT_COUNT)
    assert len(set(handed)) == len(handed)
    assert max(handed) < ports.ephemeral_low()
    assert not set(handed) & ports.FIXED
    bands = [band for answer in answers for band in answer["bands"]]
    assert len(set(bands)) == len(bands)


def test_the_rabbitmqctl_range_is_reserved_and_handed_to_every_cli_run() -> None:
    ctl = rabbitmq.ctl_ports()
    assert len(ctl) == rabbitmq.CTL_PORT_COUNT
    node = rabbitmq.RabbitServer(
        ROOT, ports.reserve_port(), ports.reserve_port(), ports.reserve_port(), "x@localhost"
    )
    assert (node.env["RABBITMQ_CTL_DIST_PORT_MIN"], node.env["RABBITMQ_CTL_DIST_PORT_MAX"]) == (
        str(ctl.start),
        str(ctl[-1]),
    )
    assert not {node.amqp_port, node.mgmt_port, node.dist_port} & set(ctl)
    assert rabbitmq.ctl_ports() == ctl  # one range a process, whichever node it talks to


def test_a_port_something_listens_on_is_skipped() -> None:
    first = ports.reserve_port()
    with socket.socket() as one, socket.socket() as two:
        one.bind(("127.0.0.1", first + 1))
        one.listen()
        two.bind(("0.0.0.0", first + 2))
        two.listen()
        assert ports.reserve_port() not in {first + 1, first + 2}


def test_a_band_is_free_again_once_its_holder_is_killed() -> None:
    (asker,) = askers(1)
    assert asker.stdin is not None
    assert asker.stdout is not None
    asker.stdin.write("go\n")
    asker.stdin.flush()
    (band, *_) = json.loads(asker.stdout.readline())["bands"]
    lock = (ports.LOCKS / f"band-{band}.lock").open("a")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            raise AssertionError(f"band {band} was not held by its living holder")
        os.kill(asker.pid, signal.SIGKILL)
        asker.wait(10)
        asker.stdin.close()
        asker.stdout.close()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no BlockingIOError: it is free
    finally:
        lock.close()


def test_every_port_the_project_binds_by_default_is_outside_the_bands_or_never_handed_out() -> None:
    defaults = dataclasses.asdict(stack.Ports())
    named = [
        *defaults.values(),
        *(int(port) for port in cluster_ha.ENSEMBLE_PORTS.split(",")),
        *(int(port) for port in cluster_ha.RABBITMQ_PORTS.split(",")),
        *(int(port) for port in cluster_ha.POSTGRES_PORTS.split(",")),
        *(int(port) for port in CLUSTER_HTTP_PORTS.split(",")),
        8080,  # make run
    ]
    bands = range(ports.FIRST_PORT, ports.FIRST_PORT + ports.BAND_COUNT * ports.BAND_SIZE)
    assert [port for port in named if port in bands and port not in ports.FIXED] == []
