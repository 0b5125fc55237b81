"""The documentation site's pages and its navigation agree, and the README's links into the docs
lead to pages that exist (mkdocs build --strict, in make check, checks the links between pages)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.docs_hooks import hook

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"


def nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(config["nav"])
    return [page for page in pages if not page.startswith(("http://", "https://"))]


def generated_pages() -> set[str]:
    return set(hook("reference").PAGES)


def written_pages() -> set[str]:
    return {
        str(path.relative_to(DOCS))
        for path in DOCS.rglob("*.md")
        if path.relative_to(DOCS).parts[0] != "hooks"
    }


def test_every_page_of_the_navigation_exists_or_is_generated() -> None:
    pages = nav_pages()
    assert "index.md" in pages
    assert "reference/configuration.md" in pages
    missing = sorted(set(pages) - written_pages() - generated_pages())
    assert missing == []
    assert len(pages) == len(set(pages)), "a page is in the navigation twice"


def test_every_page_is_in_the_navigation() -> None:
    assert len(written_pages()) > 20
    assert sorted(written_pages() - set(nav_pages())) == []


def test_no_generated_page_is_also_written_by_hand() -> None:
    assert sorted(generated_pages() & written_pages()) == []


def test_the_readmes_links_into_the_docs_lead_to_written_pages() -> None:
    """Written pages only: a generated page exists in the built site, not on GitHub."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    broken = sorted(link for link in links if link.removeprefix("docs/") not in written_pages())
    assert broken == []


def test_the_readmes_consumer_example_registers_its_handler() -> None:
    """The README's example is code that runs: it builds a Consumer (no I/O until run())."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    consumer = namespace["consumer"]
    assert consumer.group == "billing"
    assert [spec.routing_key for spec in consumer._handlers] == ["orders.expire"]


def test_every_code_block_of_the_readme_and_the_pages_is_closed() -> None:
    """An unclosed fence turns the rest of a page into code, on GitHub and in the site alike."""
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        fences = [line for line in path.read_text().splitlines() if line.lstrip().startswith("```")]
        assert len(fences) % 2 == 0, path


def test_the_pages_on_the_consumer_runner_name_each_of_its_flags() -> None:
    import argparse

    from consumers_sdk.__main__ import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {
        flag
        for action in parser._actions  # argparse keeps no public list of its options
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    assert "--log-format" in flags
    for page in ("how-to/integrations.md", "how-to/consumer-runner.md"):
        text = (DOCS / page).read_text()
        assert not {flag for flag in flags if f"`{flag}" not in text}, page
