"""The reader of the documentation's samples (tests/support/samples.py): every block of a page
under test says what its test does with it, the directives read as documented, and the test's
system moves only `make run`'s addresses."""

from __future__ import annotations

import pytest

from tests.support.samples import (
    HOW_TO,
    INTEGRATIONS,
    SDK_GUIDE,
    TUTORIALS,
    PageError,
    System,
    output_pattern,
    samples,
)

PAGE = """# A page

<!-- sample: run until "ready" -->
```sh
curl http://127.0.0.1:8080/v1/jobs
```

<!-- sample: start worker consuming billing.orders.expire -->
<!-- fmt: off -->
```sh
.venv/bin/python -m consumers_sdk examples.consumer:consumer
```
<!-- fmt: on -->

<!-- sample: output of worker -->
```text
expiring order 0 (job 01a2283c-5f10-7000-9d2e-6b0f4c1a7e35, attempt 1)
```
<!-- sample: stop worker -->

<!-- sample: not run: a fragment of your own code -->
```python
await something
```
"""


def test_every_tutorial_and_how_to_says_of_each_block_what_its_test_does_with_it() -> None:
    for page in TUTORIALS + SDK_GUIDE + INTEGRATIONS + HOW_TO:
        samples(page)  # refuses a block that does not say
    assert "docs/how-to/keys.md" in HOW_TO
    assert not set(HOW_TO) & set(SDK_GUIDE + INTEGRATIONS)
    for page in TUTORIALS:
        assert any(sample.kind in ("run", "start") for sample in samples(page)), page


def test_the_directives_read_as_documented() -> None:
    run, start, output, stop, skipped = samples("page.md", PAGE)
    assert (run.kind, run.until, run.language, run.line) == ("run", "ready", "sh", 3)
    assert (start.kind, start.name, start.consuming) == ("start", "worker", "billing.orders.expire")
    assert start.code.startswith(".venv/bin/python -m consumers_sdk")
    assert (output.kind, output.name) == ("output", "worker")
    assert (stop.kind, stop.name, stop.code) == ("stop", "worker", "")
    assert (skipped.kind, skipped.name) == ("not run", "a fragment of your own code")


@pytest.mark.parametrize(
    ("page", "says"),
    [
        ("```sh\nls\n```\n", "no sample directive"),
        ("<!-- sample: run -->\n\nSome prose.\n```sh\nls\n```\n", "right before its block"),
        ("<!-- sample: fly -->\n```sh\nls\n```\n", "unknown sample directive"),
        ("<!-- sample: not run: -->\n```sh\nls\n```\n", "says why"),
        ("<!-- sample: run -->\n", "no block after it"),
        ("<!-- sample: run -->\n```sh\nls\n", "never closes"),
    ],
)
def test_a_page_that_does_not_say_is_refused(page: str, says: str) -> None:
    with pytest.raises(PageError, match=says):
        samples("page.md", page)


def test_an_included_file_is_read_as_the_block() -> None:
    page = '<!-- sample: run -->\n```python\n--8<-- "examples/consumer.py"\n```\n'
    [sample] = samples("page.md", page)
    assert "consumer = Consumer(" in sample.code


def test_output_lines_match_any_job_id_and_any_text_for_dots() -> None:
    pattern = output_pattern("WARNING ... job 01a2291e-07c4-7000-b3f1-9e64d2a8c510 dead (x)")
    assert pattern.search("12:00 WARNING sdk: job 01a22000-0000-7000-8000-000000000001 dead (x)")
    assert not pattern.search("WARNING sdk: job 01a2291e dead (x)")
    assert not pattern.search("WARNING sdk: job 01a22000-0000-7000-8000-000000000001 dead (y)")
    logged = output_pattern("2026-11-24 13:00:00,000 INFO x: running")
    assert logged.search("2026-11-29 15:40:21,779 INFO x: running")
    assert not logged.search("2026-11-29 15:40:21,779 WARNING x: running")


def test_only_make_runs_addresses_move() -> None:
    system = System("http://api:1", "http://ui:2", "test-1", "amqp://g:g@mq:3/test-1", "pg://db")
    code = (
        "curl http://127.0.0.1:8080/v1/jobs http://127.0.0.1:15672/api/queues/%2F/q "
        "http://127.0.0.1:15672/api/bindings/%2F/e/x/q/y amqp://guest:guest@127.0.0.1:5672/ "
        "postgresql://postgres@127.0.0.1:5432/dispatcher http://127.0.0.1:8081 %2F"
    )
    assert system.rewrite(code) == (
        "curl http://api:1/v1/jobs http://ui:2/api/queues/test-1/q "
        "http://ui:2/api/bindings/test-1/e/x/q/y amqp://g:g@mq:3/test-1 "
        "pg://db http://127.0.0.1:8081 %2F"
    )
    assert system.environment["DISPATCHER_URL"] == "http://api:1"
