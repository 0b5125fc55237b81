"""mkdocs hook: the reference pages generated from the code (configuration, metrics, command
line, HTTP API), added to the site as pages of their own so that none is kept by hand."""

from __future__ import annotations

from typing import Any

import cli_page
import metrics_page
import openapi_page
import settings_page
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

# Where each generated page lives in the site, and what writes it.
PAGES = {
    "reference/configuration.md": settings_page.render,
    "reference/metrics.md": metrics_page.render,
    "reference/cli.md": cli_page.render,
    "reference/http-api.md": openapi_page.render,
}


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
