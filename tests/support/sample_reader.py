"""A reader of the documentation: someone following its pages in a directory of their own, where
`.venv` and `examples` are the repository's, one terminal per process they start, one
`python -m asyncio` session per page, on the system a test gives (tests/support/samples.py reads
the pages)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.queues import wait_for_consumer
from tests.support.samples import MAKE_RUN_ADDRESSES, ROOT, Sample, System, output_pattern

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
            # a reader's own shell: no Django project chosen (manage.py chooses its own)
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            **system.environment,
            "PYTHONUNBUFFERED": "1",  # what a terminal shows at once, a log file shows at once
            # the venv activated: an application's commands (dispatcher-consumer) are on the PATH
            "PATH": f"{home / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        }
        self.processes: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.session: subprocess.Popen[bytes] | None = None
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
        elif sample.kind in ("save", "append"):
            path = self.home / sample.name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w" if sample.kind == "save" else "a") as out:
                out.write(self.code(sample))
        elif sample.kind == "session":
            await self.in_session(sample)
        elif sample.kind == "pytest":
            await self.pytest(sample)
        elif sample.kind == "start":
            await self.start(sample)
        elif sample.kind == "stop":
            await self.stop(sample)
        elif sample.kind == "output":
            await self.sees(sample)

    def command(self, sample: Sample, *, keeps_variables: bool = True) -> list[str]:
        if sample.language == "python":  # from the reader's directory, as `python file.py` is
            return [self.python, "-c", self.code(sample)]
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

    async def in_session(self, sample: Sample) -> None:
        assert sample.language == "python", f"{sample.where}: a session runs python blocks"
        if self.session is None:
            self.session = open_session(self.python, self.home, self.env)
        block = {"where": sample.where, "given": self.system.rewrite(sample.given)}
        block["code"] = self.code(sample)
        answer = await asyncio.wait_for(asyncio.to_thread(self._ask, block), WAIT_S)
        assert answer["ok"], f"{sample.where} failed in the session:\n{answer['error']}"

    def _ask(self, block: dict[str, str]) -> dict[str, str]:
        assert self.session is not None
        assert self.session.stdin is not None
        assert self.session.stdout is not None
        self.session.stdin.write(json.dumps(block).encode() + b"\n")
        self.session.stdin.flush()
        line = self.session.stdout.readline()
        assert line, f"{block['where']}: the session ended:\n{self.session_log()}"
        answer: dict[str, str] = json.loads(line)
        return answer

    def session_log(self) -> str:
        return (self.home / ".samples" / "session.log").read_text()

    def end_session(self) -> None:
        """The page's session ends with the page, as a reader leaves `python -m asyncio`."""
        if self.session is not None:
            assert self.session.stdin is not None
            self.session.stdin.close()
            code = self.session.wait(30)
            if self.session.stdout is not None:
                self.session.stdout.close()
            self.session = None
            assert code == 0, f"the session exited {code}:\n{self.session_log()}"

    async def pytest(self, sample: Sample) -> None:
        module = (
            self.home / f"test_sample_{Path(sample.page).stem.replace('-', '_')}_{sample.line}.py"
        )
        module.write_text(self.code(sample))
        done = await asyncio.to_thread(
            subprocess.run,
            [
                self.python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "asyncio_mode=auto",
                "--rootdir",
                str(self.home),
                str(module),
            ],
            cwd=self.home,
            env={k: v for k, v in self.env.items() if not k.startswith("PYTEST_")},
            capture_output=True,
            timeout=WAIT_S,
        )
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, f"{sample.where}: its test failed:\n{output}"
        assert " passed" in output, output

    @property
    def python(self) -> str:
        return str(self.home / ".venv" / "bin" / "python")

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
        if self.session is not None:
            self.session.kill()
            self.session.communicate(timeout=10)  # closes its pipes too
            print(f"--- session.log\n{self.session_log()}")
        for process, log in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            print(f"--- {log.name}\n{log.read_text()}")


def open_session(python: str, home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The page's `python -m asyncio` session (tests/support/sample_session.py); its output and
    errors go to .samples/session.log."""
    with (home / ".samples" / "session.log").open("ab") as log:
        return subprocess.Popen(
            [python, str(ROOT / "tests" / "support" / "sample_session.py")],
            cwd=home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )


def launch(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """COMMAND in a terminal of its own (a session: Ctrl-C reaches all of it), output to LOG. As
    a terminal's shell would, it starts with Ctrl-C's default action, whatever this process was
    given: a suite started in the background (``make test &``) ignores SIGINT, and so would every
    process it starts."""
    with log.open("ab") as out:
        return subprocess.Popen(
            ["env", "--default-signal=INT", *command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
