"""Configuration: the only reader of the environment. Built once at the edge, then passed down."""

from __future__ import annotations

import functools
import os
import socket
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from consumers_sdk import broker_urls, validation
from dispatcher.amqp import event_users
from dispatcher.amqp.event_users import Grant
from dispatcher.api import hosts
from dispatcher.auth.api_keys import StaticKey, parse_static

_LIMITS = validation.DEFAULT_LIMITS  # the SDK's enqueue() checks jobs against the same defaults


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every option, with the default the embedded configuration of ``make run`` uses."""

    # Errors never echo a value: URLs carry passwords and api_keys carries tokens.
    model_config = SettingsConfigDict(
        env_prefix="DISPATCHER_", frozen=True, extra="forbid", hide_input_in_errors=True
    )

    # Services
    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/dispatcher",
        description="PostgreSQL; ?sslmode=verify-full&sslrootcert=... for TLS; "
        "host1:port,host2:port (a primary and its standbys) reaches the one that accepts writes",
    )
    amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ; amqps://...?cafile=... for TLS; a cluster's nodes as "
        "comma-separated URLs (the first that answers, the next when its node goes away)",
    )
    amqp_management_url: str = Field(
        "http://guest:guest@127.0.0.1:15672", description="RabbitMQ management API (dlq list)"
    )
    zk_hosts: str = Field(
        "",
        description="ZooKeeper servers, all of the ensemble (h1:2181,h2:2181,h3:2181[/chroot]); "
        "empty: single-node mode, this node owns every shard",
    )
    zk_path: str = Field("/dispatcher", description="the cluster's state in ZooKeeper")
    zk_session_timeout_s: float = Field(
        10.0, gt=0, description="ZooKeeper session timeout; failover takes about this long"
    )
    zk_auth: SecretStr = Field(
        SecretStr(""),
        description="user:password: digest auth, and an ACL for that identity on every znode",
    )

    # HTTP
    http_host: str = Field(
        "127.0.0.1", description="loopback unless told otherwise: an open node stays unreachable"
    )
    http_port: int = Field(8080, ge=0, le=65535, description="where the API listens")
    http_max_connections: int = Field(1024, ge=1, description="one more is closed at accept")
    http_max_connections_per_client: int = Field(
        0,
        ge=0,
        description="connections one client address (an IPv6 /64; loopback too) may hold, one more "
        "is closed at accept; 0: a quarter of http_max_connections. Behind a proxy or load "
        "balancer, whose few addresses every client comes from, raise it (at most the cap)",
    )
    http_max_requests: int = Field(
        256, ge=1, description="requests in progress at once (503 beyond); /healthz not counted"
    )
    http_header_timeout_s: float = Field(
        10.0, gt=0, description="a request's headers must arrive within this (from the connection)"
    )
    http_body_timeout_s: float = Field(
        30.0, gt=0, description="a request's body must arrive within this (from its headers)"
    )
    http_keepalive_s: int = Field(5, ge=1, description="an idle keep-alive connection is closed")
    http_write_timeout_s: float = Field(
        30.0, gt=0, description="a connection whose client takes no byte of an answer is closed"
    )
    http_send_buffer_bytes: int = Field(
        128 * 1024,
        ge=0,
        description="the kernel's send buffer per connection (0: its autotuning, up to 4 MiB)",
    )
    http_max_unsent_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024 * 1024,
        description="answer bytes all connections may hold unsent (503 or closed past it)",
    )
    allowed_hosts: str = Field(
        "", description="comma list of Host names (name or name:port); empty: any (400 otherwise)"
    )
    node_id: str = Field(
        default_factory=_default_node_id,
        min_length=1,
        max_length=200,
        description="this node's name in logs, the cluster view and its AMQP connection's name "
        "(default: hostname-pid)",
    )

    # Messaging
    exchange: str = Field("dispatcher.jobs", description="the topic exchange jobs go to")
    unroutable_exchange: str = Field(
        "dispatcher.unroutable", description="alternate exchange and queue for unroutable jobs"
    )
    unroutable_queue_type: Literal["quorum", "classic"] = Field(
        "quorum",
        description="the unroutable queue's type: quorum outlives a node (one declared classic "
        "before is kept: see the upgrade notes)",
    )

    # Scheduling
    shard_count: int = Field(
        256, ge=1, le=65536, description="logical shards; fixed when the database is first used"
    )
    lookahead_s: float = Field(60.0, gt=0, description="jobs due this far ahead are kept in memory")
    heap_cap: int = Field(200_000, ge=100, description="most jobs held in memory")
    load_batch: int = Field(5000, ge=1, description="rows per loader query")
    fire_batch: int = Field(500, ge=1, description="jobs claimed and published per round trip")
    fire_workers: int = Field(4, ge=1, description="batches in flight at once")
    lease_s: float = Field(30.0, gt=0, description="a claimed, unconfirmed job is re-fired after")
    clock_max_offset_s: float = Field(
        1.0,
        gt=0,
        description="this host's clock may be this far from PostgreSQL's; past it the node "
        "fires nothing and says so in /readyz (it fires on PostgreSQL's clock either way)",
    )
    clock_sample_s: float = Field(
        1.0,
        gt=0,
        le=600,
        description="how often the node measures PostgreSQL's clock, the one it fires on",
    )
    publish_timeout_s: float = Field(
        10.0, gt=0, description="a publish not confirmed by then counts as failed"
    )
    step_out_s: float = Field(
        10.0,
        gt=0,
        description="a node that cannot reach PostgreSQL or RabbitMQ, or trust its clock, this "
        "long gives its shards to the other nodes (in a cluster; alone it says so in /readyz)",
    )
    rejoin_s: float = Field(
        10.0,
        gt=0,
        description="a node well again waits this long before it takes shards back (twice as "
        "long after each further step-out within ten minutes, up to 8 times)",
    )
    dead_connection_s: float = Field(
        10.0,
        ge=1,
        description="a PostgreSQL or RabbitMQ connection whose data goes unacknowledged this long "
        "is dropped (TCP_USER_TIMEOUT and keepalives; the AMQP heartbeat is a third of it)",
    )
    publish_path: Literal["auto", "framed", "per_message"] = Field(
        "auto",
        description="framed: batches as one write (tested aiormq only); per_message: public API; "
        "auto: framed when the installed aiormq supports it",
    )
    sweep_grace_s: float = Field(
        15.0, gt=0, description="a scheduled job overdue this long is fired by the safety sweep"
    )
    catchup_share: float = Field(
        0.5, gt=0, le=1, description="share of a firing batch kept for overdue backlog"
    )
    catchup_max_rate: float = Field(
        0.0, ge=0, description="overdue jobs fired per second at most (0: no limit)"
    )
    live_lag_s: float = Field(
        2.0, gt=0, description="jobs this late leave the live lane for the catch-up lane"
    )

    # PostgreSQL
    db_timeout_s: float = Field(2.0, gt=0, description="a request waits this long, then 503")
    db_pool_min: int = Field(2, ge=1, description="connections the pool keeps open")
    db_pool_max: int = Field(20, ge=1, description="connections the pool opens at most")
    migrate_on_start: bool = Field(True, description="serve applies the migrations first")
    group_commit: bool = Field(
        True, description="concurrent single submissions share one transaction (off: one each)"
    )

    # Input limits
    max_payload_bytes: int = Field(
        _LIMITS.max_payload_bytes,
        ge=1,
        le=validation.MAX_PAYLOAD_BYTES_CEILING,
        description="a job's payload, encoded (413 above; at most 15 MiB)",
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="request body ceiling (413 above); each route has a tighter bound",
    )
    max_batch: int = Field(1000, ge=1, description="jobs per batch request")
    max_headers: int = Field(_LIMITS.max_headers, ge=0, description="headers per job")
    max_header_bytes: int = Field(
        _LIMITS.max_header_bytes, ge=1, description="bytes per header name + value"
    )
    max_routing_key_bytes: int = Field(
        _LIMITS.max_routing_key_bytes,
        ge=1,
        le=validation.AMQP_SHORTSTR_BYTES,
        description="routing key limit",
    )
    max_idempotency_key_length: int = Field(
        _LIMITS.max_idempotency_key_length, ge=1, description="idempotency key limit (characters)"
    )
    max_delay_days: int = Field(
        _LIMITS.max_delay_days, ge=1, description="how far ahead run_at may be"
    )

    # API keys (see the docs: how-to/api-keys.md)
    api_keys: SecretStr = Field(
        SecretStr(""),
        description="static keys: comma-separated token:scope[:namespace[:prefix|prefix...]]",
    )
    api_key_cache_s: float = Field(
        5.0,
        ge=0,
        description="stored keys are reloaded at least this often (a key notice: at once)",
    )
    api_auth_required: bool = Field(
        False, description="answer 401 even while no key is configured (fail closed)"
    )

    # Job history, retention and statistics
    retention_days: float = Field(
        7.0, gt=0, description="finished jobs (and their events) are deleted after this long"
    )
    retention_batch: int = Field(1000, ge=1, description="rows per retention DELETE")
    snapshot_warn_s: float = Field(
        600.0,
        gt=0,
        description="/readyz and /metrics warn once the oldest snapshot holding vacuum back (a "
        "long transaction, a pg_dump, a replication slot) is older than this; looked at every "
        "stats_interval_s",
    )
    stats_interval_s: float = Field(
        15.0, gt=0, description="job counts (console, /metrics) and retention run this often"
    )
    events_batch: int = Field(500, ge=1, description="consumer events recorded per round trip")
    events_prefetch: int = Field(
        64,
        ge=1,
        le=10_000,
        description="events messages a node holds unacked at once: with events_max_message_bytes, "
        "what they may take in memory",
    )
    events_max_message_bytes: int = Field(
        256 * 1024,
        ge=64 * 1024,
        le=16 * 1024 * 1024,
        description="an events message larger than this is acked unread and counted in "
        "dispatcher_events_dropped_total{reason=too_large} (the SDK sends at most 64 KiB)",
    )
    event_users: str = Field(
        "",
        description="broker users and the jobs each may report on: comma-separated "
        "user=grant, a grant being *, prefix|prefix, namespace: or namespace:prefix|prefix; "
        "empty: any publisher may report on any job (one tenant)",
    )
    metrics_routing_keys: int = Field(
        50, ge=0, description="distinct routing keys labelled in metrics; the rest are 'other'"
    )
    stats_routing_keys: int = Field(
        50, ge=1, description="routing keys /v1/stats names (most jobs first); the rest are 'other'"
    )
    rabbitmq_ui_url: str = Field(
        "", description="RabbitMQ UI for the console's links; empty: the management URL"
    )

    # Job dependencies
    dependents_batch: int = Field(
        1000, ge=1, description="dependents released or cancelled per transaction in the background"
    )
    dependents_poll_s: float = Field(
        1.0, gt=0, description="how often each node looks for deferred dependents to follow"
    )

    # Bulk actions
    bulk_batch: int = Field(
        100, ge=1, le=10_000, description="jobs a bulk action changes per transaction"
    )
    bulk_poll_s: float = Field(
        1.0, gt=0, description="how often each node looks for bulk actions to work"
    )
    bulk_lease_s: float = Field(
        30.0,
        gt=0,
        description="a node working a bulk action is relieved of it this long after"
        " its last batch (it died)",
    )
    bulk_duty: float = Field(
        0.5,
        gt=0,
        le=1,
        description="share of the time a bulk action works: after each batch it rests for"
        " (1 - share) / share times what the batch took",
    )
    bulk_rate_per_s: float = Field(
        5000.0,
        gt=0,
        description="most jobs a bulk action changes a second (a requeue's jobs are due at once:"
        " they fire at this pace beside the jobs falling due)",
    )

    bulk_count_cap: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="a dry run (and a new action's estimate) counts matching jobs up to this"
        " many, then answers 'at least' this many",
    )
    bulk_read_timeout_s: float = Field(
        5.0,
        gt=0,
        description="longest a dry run's count and sample may take (past it: 422 naming the"
        " filter, nothing changed)",
    )
    bulk_batch_timeout_s: float = Field(
        30.0,
        gt=0,
        description="longest one batch of a bulk action may take; past it the action fails with"
        " that reason (resume it, or narrow it)",
    )
    bulk_reads: int = Field(
        1,
        ge=1,
        le=16,
        description="dry runs and new actions a node counts at once; more are answered 429 with"
        " Retry-After, so claims, clock samples and probes always find a connection",
    )
    bulk_read_duty: float = Field(
        0.25,
        gt=0,
        le=1,
        description="share of each counting slot's time spent counting: after a count it rests"
        " (1 - share) / share times what the count took",
    )
    bulk_reads_per_s: float = Field(
        10.0, gt=0, description="most counts a node starts a second (dry runs and new actions)"
    )
    bulk_max_running: int = Field(
        4,
        ge=1,
        description="running actions per namespace (an operator's, made with an admin key,"
        " count apart); a new or resumed one past it is refused 409",
    )
    bulk_max_stored: int = Field(
        100,
        ge=1,
        description="actions kept per namespace, finished ones included (an operator's count"
        " apart); a new one past it is refused 409",
    )
    bulk_keep_s: float = Field(
        7 * 86_400.0,
        gt=0,
        description="a done, failed or stopped action is removed this long after it last changed",
    )

    # Recurring schedules
    schedule_ahead_s: float = Field(
        10.0, gt=0, description="occurrences become jobs this long before they are due"
    )
    schedule_poll_s: float = Field(1.0, gt=0, description="how often each node looks for them")
    schedule_catchup_batch: int = Field(
        1000, ge=1, description="most jobs a pass makes for the schedules behind (shared by them)"
    )
    schedule_catchup_window_s: float = Field(
        3600.0,
        gt=0,
        le=366 * 86400,
        description="occurrences older than this are never made up for (missed=all included)",
    )
    max_page_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1,
        description="payload bytes a page of GET /v1/jobs or /v1/schedules may hold (it ends"
        " early past them; one item at least)",
    )
    max_history_events: int = Field(
        500, ge=1, description="events a job's history shows (the newest; it says how many more)"
    )
    max_schedules_per_namespace: int = Field(
        1000, ge=1, description="schedules one namespace may hold (409 beyond)"
    )
    max_flow_rules: int = Field(
        10_000,
        ge=1,
        description="flow rules admin keys may hold together (409 beyond); a namespace's limits"
        " keys have a cap of their own",
    )
    max_flow_rules_per_namespace: int = Field(
        1000,
        ge=1,
        description="flow rules the limits keys of one namespace may hold together (409 beyond)",
    )
    schedule_min_interval_s: int = Field(
        60, ge=1, description="the shortest interval_s a schedule may have (422 below)"
    )
    max_schedule_jobs_per_minute: float = Field(
        600,
        gt=0,
        description="jobs a minute one namespace's active schedules may make together, each at"
        " its busiest (409 beyond)",
    )

    log_level: str = Field("INFO", description="the logging level: DEBUG, INFO, WARNING, ERROR")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text lines, or one JSON object a line (ts, level, logger, message, "
        "action, job_id) for log shippers",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts_parse(cls, value: str) -> str:
        hosts.parse_allowed(value)
        return value

    @field_validator("amqp_url")
    @classmethod
    def _amqp_urls_parse(cls, value: str) -> str:
        try:
            broker_urls.parse(value)
        except broker_urls.BrokerUrlError as exc:
            raise ValueError(f"DISPATCHER_AMQP_URL: {exc}") from None
        return value

    @field_validator("event_users")
    @classmethod
    def _event_users_parse(cls, value: str) -> str:
        event_users.parse(value)
        return value

    @field_validator("zk_auth")
    @classmethod
    def _zk_auth_is_user_and_password(cls, value: SecretStr) -> SecretStr:
        text = value.get_secret_value()
        user, colon, password = text.partition(":")
        if text and not (user and colon and password):
            raise ValueError("zk_auth is user:password, both non-empty")
        return value

    @field_validator("api_keys")
    @classmethod
    def _api_keys_parse(cls, value: SecretStr) -> SecretStr:
        parse_static(value.get_secret_value())
        return value

    def amqp_urls(self) -> tuple[str, ...]:
        """The broker URLs, one per node of a cluster (one for a single broker)."""
        return broker_urls.parse(self.amqp_url)

    def amqp_vhost(self) -> str:
        """The virtual host every broker URL names."""
        return broker_urls.vhost(self.amqp_urls()[0])

    def connections_per_client(self) -> int:
        """The connections one client address may hold: its setting, else a quarter of the cap
        (four addresses at least to fill the node), never more than the cap."""
        share = self.http_max_connections_per_client or max(1, self.http_max_connections // 4)
        return min(share, self.http_max_connections)

    def allowed_host_list(self) -> list[hosts.Allowed]:
        return hosts.parse_allowed(self.allowed_hosts)

    def event_grants(self) -> tuple[Grant, ...]:
        return event_users.parse(self.event_users)

    def static_keys(self) -> list[StaticKey]:
        return parse_static(self.api_keys.get_secret_value())

    def limits(self) -> validation.Limits:
        """The input limits, in the shape the SDK's ``enqueue(limits=...)`` takes."""
        return self._input_limits

    @functools.cached_property
    def _input_limits(self) -> validation.Limits:
        # Made once: every job of a batch is checked against them (the settings are frozen).
        return validation.Limits(
            max_payload_bytes=self.max_payload_bytes,
            max_headers=self.max_headers,
            max_header_bytes=self.max_header_bytes,
            max_routing_key_bytes=self.max_routing_key_bytes,
            max_idempotency_key_length=self.max_idempotency_key_length,
            max_delay_days=self.max_delay_days,
        )

    def rabbitmq_ui(self) -> str:
        """Where the console links to queues: ``rabbitmq_ui_url``, or the management URL without
        its credentials."""
        if self.rabbitmq_ui_url:
            return self.rabbitmq_ui_url.rstrip("/")
        parts = urlsplit(self.amqp_management_url)
        host = parts.hostname or "127.0.0.1"
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
