"""Writes the SDK's sync client from its async one: ``consumers_sdk/sync_client.py`` from
``consumers_sdk/client.py``, line by line, by the rules below (httpcore's "unasync" approach), so
that a method is written once. Stdlib only; run from anywhere:

    python sdk/unasync.py           # rewrite sync_client.py (make sdk-sync)
    python sdk/unasync.py --check   # exit 1, naming the file, when it differs from the output

The rules translate code, not meaning: client.py is written so that they suffice (no helper that
only asyncio has; what both clients share lives in ``calls``, ``exchange`` and ``schedulable``).
``tests/unit/test_unasync.py`` fails while the checked-in file differs from the output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "consumers_sdk" / "client.py"
TARGET = ROOT / "consumers_sdk" / "sync_client.py"
COMMAND = "make sdk-sync"

HEADER = f"""\
# Generated from consumers_sdk/client.py by `{COMMAND}` (python sdk/unasync.py): do not edit.
# Change client.py and regenerate; tests/unit/test_unasync.py fails while the two differ.
"""
# The async module's docstring speaks of asyncio; the generated one says what it is instead.
DOCSTRING = '''\
"""SyncDispatcherClient: ``DispatcherClient``'s methods and records for code without an event
loop (Django and Flask views, scripts), on httpx's sync client; ``list`` returns an iterator.
Generated from ``client.py``: the requests, the retry rules and the errors are the async client's
own (``calls``, ``exchange``).
"""
'''

# Whole words: ``SyncDispatcherClient`` is not ``DispatcherClient`` again.
CLASSES = {
    "DispatcherClient": "SyncDispatcherClient",
    "Schedules": "SyncSchedules",
    "Limits": "SyncLimits",
    "BulkActions": "SyncBulkActions",
}
# (pattern, replacement), in order, on every line after the module docstring.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\basync (def|for|with)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\b__aenter__\b"), "__enter__"),
    (re.compile(r"\b__aexit__\b"), "__exit__"),
    (re.compile(r"\.aclose\("), ".close("),
    (re.compile(r"\bAsyncIterator\b"), "Iterator"),
    (re.compile(r"\bhttpx\.Async(BaseTransport|Client)\b"), r"httpx.\1"),
    (re.compile(r"^import asyncio$"), "import time"),
    (re.compile(r"\basyncio\.sleep\("), "time.sleep("),
    # What an async method returns the caller awaits; the sync one returns the value itself.
    (re.compile(r"\bCoroutine\[Any, Any, ([\w.]+)\]"), r"\1"),
    (re.compile(r"\bCoroutine, "), ""),
    *((re.compile(rf"\b{name}\b"), sync) for name, sync in CLASSES.items()),
)
IMPORT = re.compile(r"^import \w+$")
FROM_IMPORT = re.compile(r"^from ([\w.]+) import (.+)$")
# ``for x in xs: yield x`` (an async generator cannot ``yield from``), as ruff's UP028 asks.
FOR = re.compile(r"^(\s*)for (\w+) in (.+):$")


def _module_docstring_end(lines: list[str]) -> int:
    """The index of the line after the module's docstring (which opens the file)."""
    if not lines[0].startswith('"""'):
        raise ValueError("client.py must open with its docstring")
    for index, line in enumerate(lines):
        if line.rstrip().endswith('"""') and (index > 0 or line.count('"""') == 2):
            return index + 1
    raise ValueError("client.py's docstring never ends")


def _yield_from(lines: list[str]) -> list[str]:
    out: list[str] = []
    index = 0
    while index < len(lines):
        loop = FOR.match(lines[index])
        if loop and index + 1 < len(lines):
            indent, name, iterable = loop.groups()
            if lines[index + 1] == f"{indent}    yield {name}":
                out.append(f"{indent}yield from {iterable}")
                index += 2
                continue
        out.append(lines[index])
        index += 1
    return out


def _sorted_imports(lines: list[str]) -> list[str]:
    """Imports in ruff's order again after renames: each run of ``import x`` lines sorted, and
    the names of a one-line ``from x import a, b`` (CamelCase all, as the source's are)."""
    out: list[str] = []
    for line in lines:
        found = FROM_IMPORT.match(line)
        if found and "(" not in line:
            names = sorted(name.strip() for name in found.group(2).split(","))
            line = f"from {found.group(1)} import {', '.join(names)}"
        start = len(out)
        while IMPORT.match(line) and start > 0 and IMPORT.match(out[start - 1]):
            start -= 1
        out[start:] = sorted([*out[start:], line])
    return out


def unasync(source: str) -> str:
    """The sync client's source from the async client's."""
    lines = source.splitlines()
    body = lines[_module_docstring_end(lines) :]
    for pattern, replacement in RULES:
        body = [pattern.sub(replacement, line) for line in body]
    body = _sorted_imports(_yield_from(body))
    return HEADER + DOCSTRING + "\n".join(body) + "\n"


def main(arguments: list[str]) -> int:
    generated = unasync(SOURCE.read_text())
    if arguments == ["--check"]:
        if TARGET.read_text() != generated:
            print(f"{TARGET.relative_to(ROOT)} differs from client.py's: run {COMMAND}")
            return 1
        return 0
    if arguments:
        print(__doc__)
        return 2
    TARGET.write_text(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
