"""The consumer runner's checks before anything connects: TARGET resolution, flag validation and
the pace the flags override on the Consumer."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers_sdk import Consumer, Job
from consumers_sdk import __main__ as runner

AMQP = "amqp://guest:guest@127.0.0.1:9/"


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with a module holding a Consumer and a module that is not importable."""
    (tmp_path / "runner_app.py").write_text(
        "from consumers_sdk import Consumer\n"
        f"consumer = Consumer({AMQP!r}, group='g', prefetch=8, report_events=False)\n"
        "not_one = 42\n"
    )
    (tmp_path / "runner_broken.py").write_text("import runner_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("runner_app", "runner_broken"):
        sys.modules.pop(name, None)


def test_a_target_names_a_consumer(app: Path) -> None:
    consumer = runner.load("runner_app:consumer")
    assert isinstance(consumer, Consumer)
    assert consumer.group == "g"


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("runner_app", "is not package.module:attribute"),
        ("runner_app:", "is not package.module:attribute"),
        ("runner_nowhere:consumer", "no module 'runner_nowhere'"),
        ("runner_app.sub:consumer", "no module 'runner_app.sub'"),
        ("runner_app:missing", "has no attribute 'missing'"),
        ("runner_app:not_one", "is a int, not a consumers_sdk.Consumer"),
    ],
)
def test_a_bad_target_is_one_line_and_exit_code_2(
    app: Path, target: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main([target, "--app-dir", str(app)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dispatcher-consumer: error: ")
    assert said in err


def test_a_module_whose_own_import_fails_keeps_its_traceback(app: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="runner_no_such_dependency"):
        runner.load("runner_broken:consumer")


@pytest.mark.parametrize(
    "flags",
    [
        ["--prefetch", "0"],
        ["--concurrency", "-1"],
        ["--max-per-second", "0"],
        ["--max-per-second", "nan"],
        ["--log-level", "LOUD"],
    ],
)
def test_bad_flags_exit_2(app: Path, flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        runner.build_parser().parse_args(["runner_app:consumer", *flags])
    assert exited.value.code == 2


def test_flags_override_the_consumers_pace() -> None:
    consumer = Consumer(AMQP, group="g", prefetch=8, concurrency=4, report_events=False)
    consumer.configure(max_per_second=50)
    assert (consumer.prefetch, consumer.concurrency, consumer.max_per_second) == (8, 4, 50)
    consumer.configure(prefetch=2)  # concurrency is never above prefetch
    assert (consumer.prefetch, consumer.concurrency) == (2, 2)
    consumer.configure(prefetch=64)  # the concurrency given to the constructor holds again
    assert (consumer.prefetch, consumer.concurrency) == (64, 4)
    consumer.configure(concurrency=16)
    assert (consumer.prefetch, consumer.concurrency, consumer.max_per_second) == (64, 16, 50)
    defaulted = Consumer(AMQP, group="g", prefetch=8, report_events=False)
    defaulted.configure(prefetch=20)  # no concurrency given: it follows prefetch
    assert defaulted.concurrency == 20
    with pytest.raises(ValueError, match="at least 1"):
        defaulted.configure(concurrency=0)


def test_a_sigterm_right_after_the_running_line_stops_the_runner_gracefully(
    app: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop signals are in place before the runner says it is running; they are gone after."""
    args = runner.build_parser(runner.PROG).parse_args(["runner_app:consumer"])
    consumer = runner.prepare(args)

    @consumer.handler("runner.work")
    async def work(job: Job) -> None:
        pass

    monkeypatch.setattr(runner.logs, "configure", lambda *_args, **_kwargs: None)  # keep pytest's
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    class OnRunning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("running"):
                seen.append(signal.getsignal(signal.SIGTERM))
                if seen[0] is before:  # no handler yet: a real SIGTERM would kill pytest
                    consumer.stop()
                else:
                    os.kill(os.getpid(), signal.SIGTERM)

    caplog.set_level(logging.INFO, logger=runner.__name__)
    logger = logging.getLogger(runner.__name__)
    handler = OnRunning()
    logger.addHandler(handler)
    try:
        runner.run(consumer, args)  # returns: the signal asked the consumer to stop
    finally:
        logger.removeHandler(handler)
    [at_running] = seen
    assert at_running is not before  # SIGTERM was handled when the line was written
    assert signal.getsignal(signal.SIGTERM) is before
