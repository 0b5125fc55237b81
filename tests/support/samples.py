"""The documentation's samples, read from its pages in order, each with what a test does with it.

Every fenced block of a page under test carries a directive, an HTML comment on the line before
it (rendered nowhere, read here and by whoever edits the page):

    <!-- sample: run -->                  a shell block run by bash (every command must succeed),
                                          a python block run as a script
    <!-- sample: run until "TEXT" -->     run again, up to a minute, until its output holds TEXT
    <!-- sample: start NAME -->           started in the background as NAME (shell or python)
    <!-- sample: start NAME consuming Q -->   ... and waited for until queue Q has a consumer
    <!-- sample: save PATH -->            written to PATH in the reader's directory
    <!-- sample: append PATH -->          added to the end of PATH (a module built block by block)
    <!-- sample: session -->              a python block run in the page's one session, as typed
                                          into `python -m asyncio` (top-level await, the names of
                                          the page's earlier session blocks)
    <!-- sample: session given CODE -->   ... after CODE, the reader's own values of names the
                                          block uses but does not define (`user_id`, `pool`)
    <!-- sample: pytest -->               a python test module, run by pytest (asyncio_mode auto)
    <!-- sample: output of NAME -->       each line appears in NAME's output (``...`` matches any
                                          text, a job id any job id)
    <!-- sample: not run: REASON -->      left alone, for the reason given

and one directive stands alone, for what the prose asks the reader to do:

    <!-- sample: stop NAME -->            Ctrl-C in NAME's terminal: it must end by itself

A block without a directive fails the test that reads the page: a new sample is run, or says
why not."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).parents[2]

# A list item's block is indented, its directive with it.
_DIRECTIVE = re.compile(r"^\s*<!-- sample: (?P<text>.*?) -->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[a-z]*)\s*$")
_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"\s*$')
_SKIPPED_COMMENT = re.compile(r"^\s*<!-- fmt: (on|off) -->\s*$")
_KINDS = ("run", "start", "save", "append", "session", "pytest", "output", "not run", "stop")


@dataclass(frozen=True)
class Sample:
    """One step of a page: a block with its directive, or a directive standing alone."""

    page: str
    line: int  # of the directive, 1-based
    kind: str  # one of _KINDS
    name: str  # start/stop/output: the process; save: the path; run: "" ; not run: the reason
    until: str  # run until / start until: the text awaited; else ""
    consuming: str  # start ... consuming: the queue awaited; else ""
    language: str  # the fence's language ("" for a standalone directive)
    code: str
    given: str = ""  # session given: the reader's own values, run first

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class PageError(ValueError):
    """A page whose samples cannot be read: a block without a directive, an unknown directive."""


def _directive(page: str, line: int, text: str) -> Sample:
    if text == "session" or text.startswith("session given "):
        given = text.removeprefix("session").strip().removeprefix("given ").strip()
        return Sample(page, line, "session", "", "", "", "", "", given)
    if text == "pytest":
        return Sample(page, line, "pytest", "", "", "", "", "")
    if text.startswith("not run:"):
        reason = text.removeprefix("not run:").strip()
        if not reason:
            raise PageError(f"{page}:{line}: 'not run' says why")
        return Sample(page, line, "not run", reason, "", "", "", "")
    words = shlex.split(text)
    kind = words[0] if words else ""
    if kind == "output" and words[1:2] == ["of"] and len(words) == 3:
        return Sample(page, line, "output", words[2], "", "", "", "")
    if kind == "run" and (len(words) == 1 or (len(words) == 3 and words[1] == "until")):
        return Sample(page, line, "run", "", words[2] if len(words) == 3 else "", "", "", "")
    if kind in ("start", "stop", "save", "append") and len(words) >= 2:
        rest = words[2:]
        if kind == "start" and len(rest) == 2 and rest[0] in ("consuming", "until"):
            consuming, until = (rest[1], "") if rest[0] == "consuming" else ("", rest[1])
            return Sample(page, line, "start", words[1], until, consuming, "", "")
        if not rest:
            return Sample(page, line, kind, words[1], "", "", "", "")
    raise PageError(
        f"{page}:{line}: unknown sample directive {text!r} (see tests/support/samples.py)"
    )


def samples(page: str, text: str | None = None) -> list[Sample]:
    """The samples of PAGE (a path from the repository's root), in the page's order."""
    lines = (text if text is not None else (ROOT / page).read_text()).splitlines()
    found: list[Sample] = []
    pending: Sample | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = _DIRECTIVE.match(line)
        fence = _FENCE.match(line)
        if directive:
            sample = _directive(page, index + 1, directive["text"])
            if pending is not None:
                raise PageError(f"{pending.where}: a directive with no block after it")
            if sample.kind == "stop":
                found.append(sample)
            else:
                pending = sample
        elif fence:
            end = next(
                (at for at in range(index + 1, len(lines)) if lines[at].strip() == "```"), None
            )
            if end is None:
                raise PageError(f"{page}:{index + 1}: a fence that never closes")
            if pending is None:
                raise PageError(
                    f"{page}:{index + 1}: a block with no sample directive before it "
                    "(run it, or say why not: tests/support/samples.py)"
                )
            indent = len(fence["indent"])
            code = _included("\n".join(row[indent:] for row in lines[index + 1 : end]))
            found.append(_with_block(pending, fence["language"], code))
            pending = None
            index = end
        elif pending is not None and line.strip() and not _SKIPPED_COMMENT.match(line):
            raise PageError(f"{pending.where}: a directive must come right before its block")
        index += 1
    if pending is not None:
        raise PageError(f"{pending.where}: a directive with no block after it")
    return found


def _with_block(directive: Sample, language: str, code: str) -> Sample:
    return dataclasses.replace(directive, language=language, code=code + "\n")


def _included(code: str) -> str:
    """A block that includes a file (pymdownx.snippets, base path the repository) as that file."""
    snippet = _SNIPPET.match(code.strip())
    return (ROOT / snippet["path"]).read_text().rstrip("\n") if snippet else code


# What a page shows of one run and a reader's run never repeats: a job id, a log line's time.
_OF_ONE_RUN = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}"
)


def output_pattern(line: str) -> re.Pattern[str]:
    """A line of an ``output of`` block as a pattern: ``...`` stands for any text, a job id for
    any job id and a log line's time for any time."""
    pieces = []
    for part in line.strip().split("..."):
        any_such = f"(?:{_OF_ONE_RUN.pattern})"
        pieces.append(any_such.join(re.escape(text) for text in _OF_ONE_RUN.split(part)))
    return re.compile(".*?".join(pieces))


@dataclass(frozen=True)
class System:
    """Where the test's system answers, for the addresses the pages give for `make run`'s."""

    api_url: str
    management_url: str
    vhost: str
    amqp_url: str
    database_url: str
    app_port: int = 8000  # where the reader serves an application of their own

    def rewrite(self, code: str) -> str:
        """CODE as it reads on the test's system: `make run`'s addresses replaced by the test's,
        and nothing else changed."""
        vhost = "/" + quote(self.vhost, safe="") + "/"
        replacements = {
            "amqp://guest:guest@127.0.0.1:5672/": self.amqp_url,
            "http://127.0.0.1:8080": self.api_url,
            "http://127.0.0.1:15672": self.management_url,
            "postgresql://postgres@127.0.0.1:5432/dispatcher": self.database_url,
            "http://127.0.0.1:8000": f"http://127.0.0.1:{self.app_port}",
            "--port 8000": f"--port {self.app_port}",
        }
        for address, replacement in replacements.items():
            code = code.replace(address, replacement)
        # the management API names the default vhost "%2F" in its paths
        return re.sub(r"(/api/[a-z]+)/%2F/", lambda m: m[1] + vhost, code)

    @property
    def environment(self) -> dict[str, str]:
        """The settings a reader of the pages leaves at their `make run` defaults."""
        return {
            "DISPATCHER_URL": self.api_url,
            "DISPATCHER_AMQP_URL": self.amqp_url,
            "DISPATCHER_AMQP_MANAGEMENT_URL": self.management_url,
            "DISPATCHER_DATABASE_URL": self.database_url,
        }


# The pages a reader follows in this order, on one system (tests/e2e/test_tutorials.py).
TUTORIALS = [
    "docs/tutorials/first-job.md",
    "docs/tutorials/consumer.md",
    "docs/tutorials/retries-and-dead-letters.md",
    "docs/tutorials/recurring.md",
    "docs/tutorials/dependencies.md",
    "docs/tutorials/enqueue.md",
]

# The SDK's guides (the docs' "SDK guide" page is this README), on a system of their own.
SDK_GUIDE = ["consumers_sdk/README.md", "docs/how-to/testing.md"]
# FastAPI and Django, in one directory, on a system of their own.
INTEGRATIONS = ["docs/how-to/integrations.md"]
# The other how-to pages, each block run or saying why not, on a system of their own.
HOW_TO = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "docs" / "how-to").glob("*.md")
    if str(path.relative_to(ROOT)) not in SDK_GUIDE + INTEGRATIONS
)

MAKE_RUN_ADDRESSES = re.compile(r"127\.0\.0\.1:(8080|15672|5672|5432|8000)\b|--port 8000\b")
