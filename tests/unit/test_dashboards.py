"""The Grafana dashboard queries only metrics the dispatcher exports, and Prometheus scrapes the
dispatcher. (The docs' metrics page is generated from the same registry:
tests/unit/test_docs_reference.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from dispatcher.metrics import Metrics

ROOT = Path(__file__).parents[2]
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def exported() -> set[str]:
    return {metric.name for metric in Metrics().registry.collect()}


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_the_dashboard_queries_only_exported_metrics_and_prometheus_scrapes_the_dispatcher() -> (
    None
):
    dashboard = json.loads((ROOT / "ops/grafana/dashboard.json").read_text())
    queried = {
        base(name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"dispatcher_[a-z_]+", target["expr"])
    }
    assert queried <= exported(), queried - exported()
    assert len(queried) >= 12
    scrape = yaml.safe_load((ROOT / "ops/prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["dispatcher:8080"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert {"prometheus", "grafana"} <= compose["services"].keys()
