"""A throwaway standalone ZooKeeper from Debian's jars."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from devstack import reaper
from devstack.base import ServiceError, kill_group, tail, wait_until
from devstack.ports import wait_port_free

CLASSPATH = "/usr/share/java/*:/etc/zookeeper/conf"


class ZooKeeperServer:
    def __init__(self, root: Path, client_port: int) -> None:
        self.root = root
        self.client_port = client_port
        self.hosts = f"127.0.0.1:{client_port}"
        self.log = root / "zookeeper.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.mark = reaper.current()  # the server belongs to the scope that made it (reaper.py)

    def config(self) -> list[str]:
        """The lines of ``zoo.cfg``; an ensemble member adds its peers."""
        return [
            "tickTime=500",  # short ticks let tests use sessions of a second or two
            f"dataDir={self.root / 'data'}",
            f"clientPort={self.client_port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
        ]

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start without waiting (an ensemble member serves only once a quorum is up)."""
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "zoo.cfg"
        config.write_text("\n".join(self.config()) + "\n")
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                [
                    "java",
                    "-Xmx256m",
                    "-cp",
                    CLASSPATH,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(config),
                ],
                cwd=self.root,
                env=reaper.marked(self.mark),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.root / "zookeeper.pid").write_text(str(self._process.pid))

    def wait_ready(self, deadline_s: float = 60) -> None:
        if not wait_until(self._ready, deadline_s):
            self.kill()
            raise ServiceError("zookeeper", f"not ready after {deadline_s:.0f}s", self.logs())

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            raise ServiceError("zookeeper", f"exited during start ({code})", self.logs())
        return self.four_letter("ruok") == "imok"

    def four_letter(self, word: str) -> str:
        return four_letter(self.client_port, word)

    def stop(self) -> None:
        kill_group(self._process, signal.SIGTERM)
        self._process = None
        wait_port_free(self.client_port)

    def kill(self) -> None:
        kill_group(self._process)
        self._process = None
        wait_port_free(self.client_port)

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def logs(self) -> str:
        return tail(self.log)


def four_letter(client_port: int, word: str) -> str:
    """The answer of the server on 127.0.0.1:CLIENT_PORT to a four-letter WORD ("" if none)."""
    try:
        with socket.create_connection(("127.0.0.1", client_port), timeout=2) as sock:
            sock.sendall(word.encode())
            answer = b""
            while chunk := sock.recv(4096):  # the server closes once it has answered
                answer += chunk
            return answer.decode(errors="replace")
    except OSError:
        return ""
