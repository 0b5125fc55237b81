"""The tutorials run as written, in order, as a reader would: each page's commands and code, taken
from the page (tests/support/samples.py), on one system like `make run`'s (a node, PostgreSQL and
RabbitMQ with its management API), from a directory of the reader's own where `.venv` and
`examples` are the repository's. Only the addresses move: the test's system answers where the
pages say `make run`'s does."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from devstack.dispatcher_process import DispatcherProcess
from devstack.rabbitmq import RabbitServer
from tests.support.queues import wait_for_consumer
from tests.support.samples import (
    MAKE_RUN_ADDRESSES,
    ROOT,
    TUTORIALS,
    Sample,
    System,
    output_pattern,
    samples,
)

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq_version]

WAIT_S = 60.0

# Before each shell block: every command must succeed (curl too on a 4xx or 5xx, showing the
# answer), and the variables it sets are kept for the page's next blocks, as in one terminal.
SHELL_PRELUDE = """set -euo pipefail -o allexport
curl() { command curl --fail-with-body "$@"; }
"""
SHELL_EPILOGUE = '\nenv -0 > "$SAMPLE_ENV_OUT"\n'


class Reader:
    """Someone following the pages in one directory, one terminal per background process."""

    def __init__(self, home: Path, system: System) -> None:
        self.home = home
        self.system = system
        self.env = {
            **os.environ,
            **system.environment,
            "PYTHONUNBUFFERED": "1",  # what a terminal shows at once, a log file shows at once
        }
        self.processes: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        (home / ".venv").symlink_to(sys.prefix)
        (home / "examples").symlink_to(ROOT / "examples")
        (home / ".samples").mkdir()

    def code(self, sample: Sample) -> str:
        code = self.system.rewrite(sample.code)
        leftover = MAKE_RUN_ADDRESSES.search(code)
        assert leftover is None, f"{sample.where}: {leftover[0]} is not an address the test moves"
        return code

    async def follow(self, sample: Sample) -> None:
        if sample.kind == "run":
            await self.run(sample)
        elif sample.kind == "save":
            (self.home / sample.name).write_text(self.code(sample))
        elif sample.kind == "start":
            await self.start(sample)
        elif sample.kind == "stop":
            await self.stop(sample)
        elif sample.kind == "output":
            await self.sees(sample)

    def command(self, sample: Sample, *, keeps_variables: bool = True) -> list[str]:
        script = self.home / ".samples" / f"line-{sample.line}"
        if sample.language == "python":
            script.write_text(self.code(sample))
            return [str(self.home / ".venv" / "bin" / "python"), str(script)]
        assert sample.language == "sh", f"{sample.where}: cannot run a {sample.language!r} block"
        epilogue = SHELL_EPILOGUE if keeps_variables else ""
        return ["bash", "-c", SHELL_PRELUDE + self.code(sample) + epilogue]

    async def run(self, sample: Sample) -> None:
        command = self.command(sample)
        kept = self.home / ".samples" / "env"
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            done = await asyncio.to_thread(
                subprocess.run,
                command,
                cwd=self.home,
                env={**self.env, "SAMPLE_ENV_OUT": str(kept)},
                capture_output=True,
                timeout=WAIT_S,
            )
            output = done.stdout.decode() + done.stderr.decode()
            assert done.returncode == 0, f"{sample.where} failed ({done.returncode}):\n{output}"
            if sample.until in output:
                break
            assert asyncio.get_running_loop().time() < deadline, (
                f"{sample.where}: {sample.until!r} never showed; last output:\n{output}"
            )
            await asyncio.sleep(1)
        if sample.language == "sh":
            self.keep_variables(kept.read_bytes())

    def keep_variables(self, dumped: bytes) -> None:
        for entry in dumped.split(b"\0"):
            name, _, value = entry.decode().partition("=")
            if name and not name.startswith(("BASH", "SHLVL", "_", "SAMPLE_")):
                self.env[name] = value

    async def start(self, sample: Sample) -> None:
        assert sample.name not in self.processes, f"{sample.where}: {sample.name} runs already"
        log = self.home / ".samples" / f"{sample.name}.log"
        process = launch(self.command(sample, keeps_variables=False), self.home, self.env, log)
        self.processes[sample.name] = (process, log)
        if sample.consuming:
            await wait_for_consumer(self.system.amqp_url, sample.consuming, WAIT_S)
        if sample.until:
            await self.shows(sample, sample.name, [output_pattern(sample.until)])

    async def stop(self, sample: Sample) -> None:
        """Ctrl-C in the process's terminal: it ends by itself, cleanly or interrupted."""
        process, log = self.processes.pop(sample.name)
        os.killpg(process.pid, signal.SIGINT)
        code = await asyncio.to_thread(process.wait, 30)
        assert code in (0, 130, -signal.SIGINT), (
            f"{sample.where}: {sample.name} exited {code}:\n{log.read_text()}"
        )

    async def sees(self, sample: Sample) -> None:
        lines = [output_pattern(line) for line in sample.code.splitlines() if line.strip()]
        await self.shows(sample, sample.name, lines)

    async def shows(self, sample: Sample, name: str, patterns: list[re.Pattern[str]]) -> None:
        process, log = self.processes[name]
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            text = log.read_text()
            missing = [p for p in patterns if not p.search(text)]
            if not missing:
                return
            assert process.poll() is None, f"{sample.where}: {name} exited:\n{text}"
            assert asyncio.get_running_loop().time() < deadline, (
                f"{sample.where}: {name} never printed {missing[0].pattern!r}:\n{text}"
            )
            await asyncio.sleep(0.3)

    def leave(self) -> None:
        for process, log in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            print(f"--- {log.name}\n{log.read_text()}")


def launch(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """COMMAND in a terminal of its own (a session: Ctrl-C reaches all of it), output to LOG."""
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def test_the_tutorials_run_in_order_as_written(
    tmp_path: Path,
    dispatcher: DispatcherProcess,
    rabbit_server: RabbitServer,
    amqp_url: str,
    database_url: str,
) -> None:
    system = System(
        api_url=dispatcher.url,
        management_url=rabbit_server.mgmt_url,
        vhost=unquote(urlsplit(amqp_url).path[1:]),
        amqp_url=amqp_url,
        database_url=database_url,
    )
    (tmp_path / "reader").mkdir()
    reader = Reader(tmp_path / "reader", system)
    followed = 0
    try:
        for page in TUTORIALS:
            for sample in samples(page):
                await reader.follow(sample)
                followed += sample.kind != "not run"
    finally:
        reader.leave()
    assert followed >= len(TUTORIALS)
