"""Every Prometheus collector, defined once, on a registry per node (tests run several nodes)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_submitted = Counter(
            "dispatcher_jobs_submitted", "Jobs created through the API", registry=r
        )
        self.jobs_dispatched = Counter(
            "dispatcher_jobs_dispatched", "Jobs published and confirmed by RabbitMQ", registry=r
        )
        self.jobs_cancelled = Counter("dispatcher_jobs_cancelled", "Jobs cancelled", registry=r)
        self.jobs_expired = Counter(
            "dispatcher_jobs_expired", "Jobs whose ttl ran out before they could fire", registry=r
        )
        self.publish_failures = Counter(
            "dispatcher_publish_failures", "Publishes RabbitMQ did not confirm", registry=r
        )
        self.fire_lateness = Histogram(
            "dispatcher_fire_lateness_seconds",
            "Confirmed-in-RabbitMQ time minus run_at",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.auth_refused = Counter(
            "dispatcher_auth_refused",
            "Requests refused for a missing or invalid API key (401) or a missing scope (403)",
            ["status"],
            registry=r,
        )
        self.heap_size = Gauge("dispatcher_heap_size", "Jobs held in memory", registry=r)
        self.shards_owned = Gauge("dispatcher_shards_owned", "Shards this node owns", registry=r)
        self.rebalances = Counter(
            "dispatcher_rebalances", "Assignments written while this node led", registry=r
        )
        self.since_assignment_change = Gauge(
            "dispatcher_seconds_since_assignment_change",
            "Time since this node last saw the shard assignment change",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
