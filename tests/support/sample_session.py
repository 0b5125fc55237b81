"""One session for a page's Python samples, as a reader types them into `python -m asyncio`:
each block (a JSON line on stdin) runs with top-level await, in one namespace and one event loop;
a JSON line on the original stdout answers whether it ran. Run by the reader's own interpreter,
so it imports nothing of the repository."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import sys
import traceback


def main() -> None:
    sys.path[0] = ""  # the reader's directory, as `python -m asyncio` has it, not this script's
    answers = sys.stdout
    sys.stdout = sys.stderr  # what the samples print goes to the session's log, not the answers
    namespace: dict[str, object] = {"__name__": "__main__"}
    with asyncio.Runner() as runner:
        for line in sys.stdin:
            block = json.loads(line)
            try:
                for code in (block["given"], block["code"]):
                    compiled = compile(
                        code, block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                    )
                    result = eval(compiled, namespace)  # the page's own sample
                    if inspect.iscoroutine(result):
                        runner.run(result)
                answer = {"ok": True, "error": ""}
            except BaseException:  # any failure is the sample's: reported
                answer = {"ok": False, "error": traceback.format_exc()}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()


if __name__ == "__main__":
    main()
