"""Every Prometheus collector, defined once, on a registry per node (tests run several nodes)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


OTHER = "other"
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


class _Routed(Protocol):
    @property
    def routing_key(self) -> str: ...


class RoutingKeyLabels:
    """Bounded label cardinality: the first ``limit`` distinct routing keys seen keep their name,
    every later one counts as ``other`` (a producer inventing keys cannot grow the registry)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._known: set[str] = set()

    def __call__(self, routing_key: str) -> str:
        if routing_key in self._known:
            return routing_key
        if len(self._known) < self._limit:
            self._known.add(routing_key)
            return routing_key
        return OTHER


# A held job's lateness is the pause's length: minutes to days.
HELD_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0, 7 * 86400.0)


class Metrics:
    def __init__(self, *, routing_key_labels: int = 50) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.key_label = RoutingKeyLabels(routing_key_labels)
        r = self.registry
        key = ["routing_key"]
        self.jobs_submitted = Counter(
            "dispatcher_jobs_submitted", "Jobs created through the API", key, registry=r
        )
        self.jobs_dispatched = Counter(
            "dispatcher_jobs_dispatched",
            "Jobs published and confirmed by RabbitMQ",
            key,
            registry=r,
        )
        self.jobs_cancelled = Counter(
            "dispatcher_jobs_cancelled", "Jobs cancelled", key, registry=r
        )
        self.jobs_expired = Counter(
            "dispatcher_jobs_expired",
            "Jobs whose ttl ran out before they could fire",
            key,
            registry=r,
        )
        self.consumer_outcomes = Counter(
            "dispatcher_consumer_outcomes",
            "Attempts' outcomes reported by consumers (started, succeeded, failed, dead)",
            ["outcome", "routing_key"],
            registry=r,
        )
        self.publish_confirms = Counter(
            "dispatcher_publish_confirms", "Publishes RabbitMQ confirmed", registry=r
        )
        self.claims = Counter(
            "dispatcher_claims",
            "Fenced claim statements firing ran (jobs dispatched per claim: what one serves)",
            registry=r,
        )
        self.claims_fenced = Counter(
            "dispatcher_claims_fenced_early",
            "Jobs a claim refused because PostgreSQL's clock had not reached their run_at (this "
            "node's idea of the time was ahead): put back, never published",
            registry=r,
        )
        self.clock_offset = Gauge(
            "dispatcher_clock_offset_seconds",
            "This host's wall clock minus PostgreSQL's, as last measured (nothing fires on it)",
            registry=r,
        )
        self.clock_error = Gauge(
            "dispatcher_clock_error_seconds",
            "How far the node's time (PostgreSQL's clock, measured) may be off: half a round "
            "trip plus drift since",
            registry=r,
        )
        self.clock_steps = Counter(
            "dispatcher_clock_steps",
            "Times a clock was seen to step (this host's monotonic one, or PostgreSQL's)",
            registry=r,
        )
        self.oldest_snapshot = Gauge(
            "dispatcher_oldest_snapshot_seconds",
            "Age of the oldest snapshot holding vacuum back (a session's transaction, a prepared "
            "transaction, a replication slot): dead rows pile up in the queue's indexes until it "
            "ends",
            registry=r,
        )
        self.vacuum_held_back = Gauge(
            "dispatcher_vacuum_held_back",
            "1 while the oldest snapshot holding vacuum back is older than "
            "DISPATCHER_SNAPSHOT_WARN_S",
            registry=r,
        )
        self.standing = Gauge(
            "dispatcher_standing",
            "What this node can do: 0 ok, 1 a service failing (under the step-out bound), 2 "
            "stepped out (its shards go to the others), 3 well again, waiting to rejoin",
            registry=r,
        )
        self.step_outs = Counter(
            "dispatcher_step_outs",
            "Times this node stepped out: PostgreSQL or RabbitMQ out of its reach, or its clock "
            "untrusted, for longer than the step-out bound",
            registry=r,
        )
        self.window_horizon = Gauge(
            "dispatcher_window_horizon_seconds",
            "How far ahead of now the jobs held in memory reach (the loader's horizon)",
            registry=r,
        )
        self.scheduled_backlog = Gauge(
            "dispatcher_scheduled_jobs",
            "Scheduled jobs in the database (refreshed by the stats task)",
            registry=r,
        )
        self.jobs_by_state = Gauge(
            "dispatcher_jobs",
            "Jobs in the database by state (refreshed by the stats task)",
            ["state"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "dispatcher_retention_deleted", "Finished jobs deleted after the retention", registry=r
        )
        self.api_latency = Histogram(
            "dispatcher_api_request_seconds",
            "API request latency by route template, method and status",
            ["route", "method", "status"],
            buckets=API_BUCKETS,
            registry=r,
        )
        self.publish_failures = Counter(
            "dispatcher_publish_failures", "Publishes RabbitMQ did not confirm", registry=r
        )
        self.fire_lateness = Histogram(
            "dispatcher_fire_lateness_seconds",
            "Confirmed-in-RabbitMQ time minus run_at, of the jobs no flow rule held",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.held_lateness = Histogram(
            "dispatcher_held_lateness_seconds",
            "Confirmed-in-RabbitMQ time minus run_at, of the jobs a flow rule held back (a paused"
            " key's, fired once let go; a metered key's): lateness an operator chose, apart from"
            " the dispatcher's",
            buckets=HELD_BUCKETS,
            registry=r,
        )
        self.flow_rules = Gauge(
            "dispatcher_flow_rules",
            "Flow rules this node applies, by what they do (paused: holding its jobs now; rate,"
            " in_flight: metering them)",
            ["limit"],
            registry=r,
        )
        self.flow_let_go = Counter(
            "dispatcher_flow_let_go",
            "Jobs of metered routing keys this node's meter let go (within their rate and slots)",
            registry=r,
        )
        self.auth_refused = Counter(
            "dispatcher_auth_refused",
            "Requests refused for a missing or invalid API key (401) or a missing scope (403)",
            ["status"],
            registry=r,
        )
        self.http_refused = Counter(
            "dispatcher_http_refused",
            "Requests and connections the HTTP edge refused, by reason (unauthenticated,"
            " forbidden, body_too_large, header_timeout, too_many_connections,"
            " too_many_connections_per_client, write_timeout, write_budget, ...)",
            ["reason"],
            registry=r,
        )
        self.http_unsent_bytes = Gauge(
            "dispatcher_http_unsent_bytes",
            "Answer bytes the HTTP connections hold that their clients have not taken yet",
            registry=r,
        )
        self.schedules_parked = Counter(
            "dispatcher_schedules_parked",
            "Schedules paused by the materialiser: they could not be planned or their jobs stored",
            registry=r,
        )
        self.dependents_followed = Counter(
            "dispatcher_dependents_followed",
            "Dependents released or cancelled by the background follow-up (not those the trigger"
            " followed in the prerequisite's own transaction)",
            ["outcome"],
            registry=r,
        )
        self.bulk_jobs_changed = Counter(
            "dispatcher_bulk_jobs_changed",
            "Jobs a bulk action changed on this node (cancelled, requeued, rescheduled)",
            ["action"],
            registry=r,
        )
        self.publish_framed = Gauge(
            "dispatcher_publish_framed",
            "1 while firing frames its batches as one write, 0 while it publishes one message at "
            "a time (aiormq outside the tested range, or DISPATCHER_PUBLISH_PATH=per_message)",
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

        self.loop_failures = Counter(
            "dispatcher_loop_failures",
            "Background loops' failures by loop and kind (transient: a service was away; "
            "unexpected: a bug or a poison input), each followed by a restart after a backoff",
            ["loop", "kind"],
            registry=r,
        )
        self.loop_degraded = Gauge(
            "dispatcher_loop_degraded",
            "1 while a background loop is failing (restarting after a backoff)",
            ["loop"],
            registry=r,
        )
        self.events_refused = Counter(
            "dispatcher_events_refused",
            "Consumer events that could not be recorded (not a job event, or PostgreSQL refused "
            "them), dead-lettered to dispatcher.events.dead",
            registry=r,
        )
        self.events_dead_letters = Gauge(
            "dispatcher_events_dead_letters",
            "Events waiting in dispatcher.events.dead (refused, or redelivered past the limit)",
            registry=r,
        )
        self.events_ignored = Counter(
            "dispatcher_events_ignored",
            "Consumer events ignored (kept in the history, a few a job, or only counted): another "
            "dispatch round (other_round), none while the job has one (no_round), another routing "
            "key than the job's (routing_key); with DISPATCHER_EVENT_USERS, a message without a "
            "user_id (no_user) or from a user not granted the job (publisher)",
            ["reason"],
            registry=r,
        )
        self.events_dropped = Counter(
            "dispatcher_events_dropped",
            "Events messages acked without being read: larger than "
            "DISPATCHER_EVENTS_MAX_MESSAGE_BYTES (too_large)",
            ["reason"],
            registry=r,
        )
        self.jobs_parked = Counter(
            "dispatcher_jobs_parked",
            "Jobs taken out of firing as dead for a reason that is not transient (last_error)",
            key,
            registry=r,
        )

    def count_by_key(self, counter: Counter, items: Iterable[_Routed]) -> None:
        """Add one per item to ``counter``, labelled by its (bounded) routing key; one ``inc``
        per distinct key, not per item, on the hot paths."""
        for key, n in Tally(self.key_label(item.routing_key) for item in items).items():
            self.child(counter, key).inc(n)

    def child(self, metric: _Labelled, *values: str) -> Any:
        """``metric.labels(*values)``, kept: prometheus_client checks and locks on every call,
        which the request path paid per request. Every label set here is bounded already."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def refusal(self, reason: str) -> None:
        """Count one refusal at the HTTP edge (``reason``: see ``http_refused``)."""
        self.http_refused.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
