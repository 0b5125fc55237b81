"""The metrics reference: every collector of ``dispatcher.metrics.Metrics``."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase

from dispatcher.metrics import Metrics

INTRO = """\
# Metrics

What `GET /metrics` exports (Prometheus text, monitor scope), one registry per node. Labels per
routing key are bounded: the first `DISPATCHER_METRICS_ROUTING_KEYS` (50) distinct keys a node
sees keep their name, the rest count as `other`. What they mean in operation, and the Grafana
dashboard: [Metrics and the Grafana dashboard](../how-to/metrics.md).

This page is generated from `dispatcher/metrics.py`.

| metric | type | labels | what |
|---|---|---|---|
"""


def collectors() -> list[MetricWrapperBase]:
    """The collectors a node's ``Metrics`` defines, in the order it defines them."""
    return [value for value in vars(Metrics()).values() if isinstance(value, MetricWrapperBase)]


def exported_name(collector: MetricWrapperBase) -> str:
    # prometheus_client adds _total to a counter's name when it exports it.
    suffix = "_total" if collector._type == "counter" else ""
    return f"{collector._name}{suffix}"


def rows() -> list[tuple[str, str, str, str]]:
    return [
        (
            exported_name(collector),
            str(collector._type),
            ", ".join(f"`{label}`" for label in collector._labelnames),
            collector._documentation,
        )
        for collector in collectors()
    ]


def render() -> str:
    return INTRO + "".join(
        f"| `{name}` | {kind} | {labels} | {what} |\n" for name, kind, labels, what in rows()
    )
