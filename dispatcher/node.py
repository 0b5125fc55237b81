"""The composition root: builds every component from Settings, starts them in order, stops them in
reverse. Background loops run as named, supervised tasks in one TaskGroup, created and stopped
from one table (``lifecycle``): a failing loop is restarted after a backoff and shown in /readyz;
only what cannot heal (``errors.Fatal``) or the HTTP server stopping ends the node."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Any

from consumers_sdk import broker_urls
from dispatcher import errors, lifecycle, metrics, supervision
from dispatcher.amqp import events, publisher
from dispatcher.amqp.events import EventsConsumer
from dispatcher.amqp.publisher import Publisher
from dispatcher.api import app
from dispatcher.api.context import ApiContext
from dispatcher.api.server import HttpServer
from dispatcher.auth.keyring import Keyring
from dispatcher.bulk import model as bulk
from dispatcher.bulk.runner import BulkRunner
from dispatcher.cluster import ownership as ownership_mod
from dispatcher.dependencies.followup import DependentsFollower
from dispatcher.firing import lanes, loader, pacing
from dispatcher.firing.firer import Firer, Publishers
from dispatcher.firing.loader import Loader, SweepTimes, WindowLimits
from dispatcher.flow.control import FlowControl
from dispatcher.health import Health, Service, Standing
from dispatcher.intake.service import Intake
from dispatcher.lifecycle import Phase, Task
from dispatcher.recurring.materialiser import Materialiser
from dispatcher.settings import Settings
from dispatcher.store import due_notices, listen, migrate
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.bulk_actions import BulkActionStore
from dispatcher.store.clock import ClockStore
from dispatcher.store.db import Database
from dispatcher.store.flow_rules import FlowRuleStore
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.listen import ChannelListener
from dispatcher.store.schedules import ScheduleStore
from dispatcher.store.shards import ShardStore
from dispatcher.store.snapshots import SnapshotStore
from dispatcher.timing.kinds import Mono
from dispatcher.timing.timekeeper import Timekeeper
from dispatcher.upkeep.housekeeping import Housekeeper
from dispatcher.upkeep.stewardship import Steward
from dispatcher.upkeep.vacuum_horizon import Horizon
from dispatcher.upkeep.vacuum_watch import VacuumWatch

logger = logging.getLogger(__name__)
# A live node whose shard moved has its confirm timeout and this much more (the mark's round trip)
# to settle a claim it made before another node fires it again (``loader.SweepTimes``).
HANDOVER_MARK_S = 2.0


class Node:
    def __init__(self, settings: Settings, *, mono: Mono = time.monotonic) -> None:
        """MONO: the clock the node's time is measured from (a test steps it under the node)."""
        self.settings = settings
        self.metrics = metrics.Metrics(routing_key_labels=settings.metrics_routing_keys)
        self.supervisor = supervision.Supervisor(self.metrics)
        self.db = Database(
            settings.database_url,
            min_size=settings.db_pool_min,
            max_size=settings.db_pool_max,
            timeout_s=settings.db_timeout_s,
            dead_connection_s=settings.dead_connection_s,
        )
        # The node's time is PostgreSQL's clock, measured: never this host's wall clock.
        self.timekeeper = Timekeeper(
            ClockStore(self.db),
            self.metrics,
            max_offset_s=settings.clock_max_offset_s,
            interval_s=settings.clock_sample_s,
            mono=mono,
        )
        now = self.timekeeper.now
        self.store = JobStore(self.db, node_id=settings.node_id, lease_s=settings.lease_s)
        self.shard_store = ShardStore(self.db)
        self.history = HistoryStore(self.db, settings.event_grants())
        self.events = EventsConsumer(
            self._amqp_urls(),
            store=self.history,
            metrics=self.metrics,
            connection_name=f"dispatcher-{settings.node_id}-events",
            batch=settings.events_batch,
            prefetch=settings.events_prefetch,
            max_message_bytes=settings.events_max_message_bytes,
            stats_interval_s=settings.stats_interval_s,
            dead_connection_s=settings.dead_connection_s,
        )
        self.housekeeper = Housekeeper(
            self.history,
            self.metrics,
            retention_s=settings.retention_days * 86400,
            batch=settings.retention_batch,
            stats_interval_s=settings.stats_interval_s,
            routing_keys=settings.stats_routing_keys,
        )
        self.keyring = Keyring(
            static=settings.static_keys(),
            store=KeyStore(self.db),
            cache_s=settings.api_key_cache_s,
            required=settings.api_auth_required,
        )
        self.ownership: ownership_mod.Ownership = self._build_ownership()
        self.publisher = self._build_publisher("publisher")
        self.live_publisher = self._build_publisher("live-publisher")
        # The due lanes: the loader fills them, the firer takes from them.
        self.lanes = lanes.Lanes(
            catchup_share=settings.catchup_share,
            pace=pacing.Pace(settings.catchup_max_rate, batch=settings.fire_batch),
        )
        # Flow control, its rules read before firing: loads and claims pass over what they hold.
        self.flow = FlowControl(
            FlowRuleStore(
                self.db,
                max_rules=settings.max_flow_rules,
                max_rules_per_namespace=settings.max_flow_rules_per_namespace,
            ),
            self.lanes,
            self.metrics,
            epochs=self.ownership.epochs,
            now_dt=self.timekeeper.now_dt,
        )
        self.loader = Loader(
            self.store,
            self.lanes,
            window=WindowLimits(
                lookahead_s=settings.lookahead_s,
                heap_cap=settings.heap_cap,
                load_batch=settings.load_batch,
                live_lag_s=settings.live_lag_s,
            ),
            sweeps=SweepTimes(
                every_s=min(settings.lease_s / 2, 5.0),
                grace_s=settings.sweep_grace_s,
                handover_s=settings.publish_timeout_s + HANDOVER_MARK_S,
            ),
            now=now,
            members=self.ownership.members,
            admission=self.flow,
        )
        # One LISTEN connection for every notice: due jobs for the loader, key changes for auth.
        self.notices = ChannelListener(self.db, name=f"dispatcher-{settings.node_id}-notices")
        due_notices.subscribe(
            self.notices,
            offer=self.loader.offer,
            on_connect=lambda: self.loader.rewind(settings.sweep_grace_s),
            shard_count=settings.shard_count,
        )
        self.keyring.listen(self.notices)
        self.flow.listen(self.notices)
        self.flow.follow(self.loader)
        self.firer = Firer(
            store=self.store,
            publishers=Publishers(shared=self.publisher, live=self.live_publisher),
            ownership=self.ownership,
            due_lanes=self.lanes,
            metrics=self.metrics,
            batch=settings.fire_batch,
            workers=settings.fire_workers,
            timekeeper=self.timekeeper,
            admission=self.flow,
        )
        self.intake = Intake(
            store=self.store,
            window=self.loader,
            ownership=self.ownership,
            metrics=self.metrics,
            shard_count=settings.shard_count,
            lookahead_s=settings.lookahead_s,
            group_commit=settings.group_commit,
            now=now,
        )
        self.vacuum_watch = VacuumWatch(
            SnapshotStore(self.db),
            Horizon(warn_after_s=settings.snapshot_warn_s),
            self.metrics,
            interval_s=settings.stats_interval_s,
        )
        self.schedules = ScheduleStore(self.db)
        self.materialiser = Materialiser(
            self.schedules,
            self.intake,
            ahead_s=settings.schedule_ahead_s,
            poll_s=settings.schedule_poll_s,
            per_schedule=settings.schedule_catchup_batch,
            catchup_s=settings.schedule_catchup_window_s,
            metrics=self.metrics,
            now_dt=self.timekeeper.now_dt,
        )
        self.dependents = DependentsFollower(
            self.db,
            self.metrics,
            batch=settings.dependents_batch,
            poll_s=settings.dependents_poll_s,
        )
        self.bulk_actions = BulkActionStore(
            self.db,
            bulk.Bounds(
                count_cap=settings.bulk_count_cap,
                read_timeout_s=settings.bulk_read_timeout_s,
                batch_timeout_s=settings.bulk_batch_timeout_s,
                reads=settings.bulk_reads,
                read_duty=settings.bulk_read_duty,
                reads_per_s=settings.bulk_reads_per_s,
                max_running=settings.bulk_max_running,
                max_stored=settings.bulk_max_stored,
                keep_s=settings.bulk_keep_s,
            ),
        )
        self.bulk_runner = BulkRunner(
            self.bulk_actions,
            self.metrics,
            node_id=settings.node_id,
            batch=settings.bulk_batch,
            poll_s=settings.bulk_poll_s,
            lease_s=settings.bulk_lease_s,
            duty=settings.bulk_duty,
            rate_per_s=settings.bulk_rate_per_s,
            shards=lambda: list(self.ownership.epochs()),
            notify_within_s=settings.lookahead_s,
            on_requeued=self.loader.catch_up,
        )
        # What the node can do now; in a cluster, a node that cannot gives its shards away.
        self.steward = Steward(
            Health(step_out_s=settings.step_out_s, rejoin_s=settings.rejoin_s),
            self.ownership,
            self.metrics,
            probes={Service.POSTGRES: self.db.probe, Service.RABBITMQ: self.publisher.probe},
            distrust_clock=self.timekeeper.distrust,
        )
        self.metrics.heap_size.set_function(lambda: self.lanes.live_count)
        self.metrics.window_horizon.set_function(self._horizon_s)
        self.app = app.create_api(self._api_context())
        self.http = HttpServer(settings, self.app, self.metrics)
        self._stop = asyncio.Event()
        self.started = asyncio.Event()

    def _api_context(self) -> ApiContext:
        """What the routes use: the API sees these, never the node."""
        return ApiContext(
            settings=self.settings,
            intake=self.intake,
            jobs=self.store,
            history=self.history,
            schedules=self.schedules,
            keyring=self.keyring,
            metrics=self.metrics,
            now_dt=self.timekeeper.now_dt,
            readiness=self.readiness,
            degraded=self.supervisor.degraded,
            clock=self.timekeeper.describe,
            standing=self._standing,
            publish_path=lambda: {
                "path": self.publisher.path,
                "fallback_reason": self.publisher.fallback_reason,
            },
            counts=lambda: self.housekeeper.snapshot,
            heap_size=lambda: self.lanes.live_count,
            cluster=self.ownership.describe,
            vacuum=self.vacuum_watch.horizon.describe,
            flow_rules=self.flow.store,
            rules=lambda: self.flow.book,
            rules_changed=self.flow.refresh,
            bulk_actions=self.bulk_actions,
            bulk_started=self.bulk_runner.wake,
        )

    def _amqp_urls(self) -> tuple[str, ...]:
        """The broker URLs with a heartbeat of half ``dead_connection_s`` where a URL sets none:
        the broker drops a connection it has not heard from in two of them (a node whose packets
        stopped arriving), rather than after RabbitMQ's default of a minute."""
        heartbeat = max(1, round(self.settings.dead_connection_s / 2))
        return broker_urls.with_default(self.settings.amqp_url, "heartbeat", str(heartbeat))

    def _build_publisher(self, role: str) -> Publisher:
        return Publisher(
            self._amqp_urls(),
            exchange=self.settings.exchange,
            unroutable_exchange=self.settings.unroutable_exchange,
            connection_name=f"dispatcher-{self.settings.node_id}-{role}",
            timeout_s=self.settings.publish_timeout_s,
            metrics=self.metrics,
            path=self.settings.publish_path,
            unroutable_queue_type=self.settings.unroutable_queue_type,
            now=self.timekeeper.now,
            dead_connection_s=self.settings.dead_connection_s,
        )

    def _build_ownership(self) -> ownership_mod.Ownership:
        if not self.settings.zk_hosts:
            return ownership_mod.SingleNode(
                self.shard_store,
                node_id=self.settings.node_id,
                shard_count=self.settings.shard_count,
            )
        from dispatcher.cluster import zk_ownership  # kazoo is imported in cluster mode only

        return zk_ownership.ZkOwnership(self.settings, self.shard_store, self.metrics)

    def _horizon_s(self) -> float:
        horizon = self.loader.horizon
        return 0.0 if horizon is None else max(0.0, horizon.timestamp() - self.timekeeper.now())

    # --- lifecycle ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def _tasks(self, *, serve_http: bool) -> list[Task]:
        """Every background task, in start order, with how it is stopped (``lifecycle``): the HTTP
        server first, then firing and what makes jobs drain, then the cluster is left; the AMQP
        connections, the loader and the rest are cancelled last, in reverse."""
        # A server that stops on its own ends the node: it is not restarted.
        http = Task(
            "http",
            lambda: self.http.serve(stopping=self._stop.is_set),
            Phase.SERVE,
            self.http.stop,
            supervised=False,
        )
        # Loops whose service errors reach the supervisor restart at the pace they retried at.
        pace = supervision.Backoff
        reconnect = pace(first_s=publisher.RECONNECT_FIRST_S, max_s=publisher.RECONNECT_MAX_S)
        relisten = pace(first_s=listen.RECONNECT_FIRST_S, max_s=listen.RECONNECT_MAX_S)
        events_retry = pace(first_s=events.RETRY_FIRST_S, max_s=events.RETRY_MAX_S)
        reload = pace(first_s=loader.RETRY_FIRST_S, max_s=loader.RETRY_MAX_S)
        return [
            Task("clock", self.timekeeper.run),
            Task("standing", self.steward.run),
            Task("amqp-connect", self.publisher.run, backoff=reconnect),
            Task("amqp-connect-live", self.live_publisher.run, backoff=reconnect),
            Task("ownership", self.ownership.run, Phase.LEAVE, self.ownership.stop),
            Task("intake", self.intake.run),
            Task("ownership-watch", self._watch_ownership),
            Task("loader", self.loader.run, backoff=reload),
            Task("sweeper", self.loader.run_sweeps, backoff=reload),
            Task("notices", self.notices.run, backoff=relisten),
            Task("firing", self.firer.run, Phase.DRAIN, self.firer.stop),
            Task("events", self.events.run, backoff=events_retry),
            Task("housekeeping", self.housekeeper.run),
            *self.flow.tasks(),
            Task("vacuum-watch", self.vacuum_watch.run),
            Task("schedules", self.materialiser.run, Phase.DRAIN, self.materialiser.stop),
            Task("dependents", self.dependents.run, Phase.DRAIN, self.dependents.stop),
            Task("bulk-actions", self.bulk_runner.run, Phase.DRAIN, self.bulk_runner.stop),
            *([http] if serve_http else []),
        ]

    async def run(self, *, serve_http: bool = True) -> None:
        """Start everything, run until ``request_stop``, then stop phase by phase. Raises
        ``errors.HttpServerUnsupported`` first, before any service is touched, if SERVE_HTTP and
        the installed uvicorn is not the one the HTTP edge's guards were written for."""
        if serve_http:
            self.http.require()
        try:
            if not await self._start():
                return  # asked to stop before the services answered
            tasks = lifecycle.Tasks(
                self._tasks(serve_http=serve_http), supervise=self.supervisor.supervise
            )
            async with asyncio.TaskGroup() as group:
                tasks.start(group)
                self.started.set()
                await self._stop.wait()
                logger.info("stopping", extra={"action": "stop"})
                self.supervisor.close()
                await tasks.stop()
        finally:
            await _closed("ownership", self.ownership.stop())
            await _closed("publisher", self.publisher.close())
            await _closed("live publisher", self.live_publisher.close())
            await _closed("database pool", self.db.close())
            logger.info("stopped", extra={"action": "stopped"})

    async def _start(self) -> bool:
        """Open the pool, migrate, join: retried while a service is away (a node started before
        its database, say); False when asked to stop meanwhile."""
        backoff = supervision.restarts()
        while not self._stop.is_set():
            try:
                await self.db.open()
                if self.settings.migrate_on_start:
                    await migrate.apply_migrations(self.settings.database_url)
                else:
                    await migrate.check(self.settings.database_url)
                await self.timekeeper.start()
                await self.flow.load()
                await self._log_auth_mode()
                await self.ownership.start()
                return True
            except errors.TRANSIENT as exc:
                delay = backoff.next()
                logger.warning(
                    "starting: %s; trying again in %.1fs", exc, delay, extra={"action": "start"}
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
        return False

    async def _watch_ownership(self) -> None:
        while True:
            change = await self.ownership.next_change()
            self.loader.lose(change.lost)
            self.loader.gain(change.gained)
            self.metrics.shards_owned.set(len(self.ownership.epochs()))
            logger.info(
                "ownership: +%d -%d shards, %d owned",
                len(change.gained),
                len(change.lost),
                len(self.ownership.epochs()),
                extra={"action": "ownership"},
            )

    async def _log_auth_mode(self) -> None:
        if await self.keyring.enabled():
            logger.info("API keys required", extra={"action": "auth"})
        else:
            host, port = self.settings.http_host, self.settings.http_port
            logger.warning(
                "the API is OPEN at http://%s:%d: no API key is configured, every caller may do "
                "everything",
                host,
                port,
                extra={"action": "auth"},
            )
            if not _is_loopback(host):
                logger.warning(
                    "the open API is bound to %s, beyond this machine: configure an API key "
                    "(DISPATCHER_API_KEYS) or bind to 127.0.0.1",
                    host,
                    extra={"action": "auth"},
                )

    async def readiness(self) -> dict[str, bool]:
        return {
            "postgres": self.steward.answering(Service.POSTGRES),
            "rabbitmq": self.publisher.is_ready()
            and self.live_publisher.is_ready()
            and self.steward.answering(Service.RABBITMQ),
            "zookeeper": self.ownership.coordinated(),
            "shards": bool(self.ownership.epochs()),
            "clock": self.timekeeper.trusted(),
            # Stepped out (or waiting to rejoin); a service failing shows in its own check.
            "standing": self.steward.standing() in (Standing.OK, Standing.FAILING),
            "loops": not self.supervisor.degraded(),
        }

    def _standing(self) -> dict[str, object]:
        """For ``/readyz``: the node's standing, and when firing last claimed and had a publish
        confirmed."""
        now = time.monotonic()
        answer = self.steward.describe()
        for name, at in (("claim", self.firer.claimed_at), ("confirm", self.firer.confirmed_at)):
            answer[f"last_{name}_s_ago"] = None if at is None else round(now - at, 3)
        reason = self.steward.reason()
        if reason is not None:
            answer["reason"] = reason
        return answer


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or 0.0.0.0, ::): assume it is reachable from elsewhere


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(settings: Settings) -> None:
    """Run a node until SIGTERM or SIGINT. The handlers are the loop's while the node runs and
    removed once it has stopped (the signals' defaults again), as the SDK's consumer runner does."""
    node = Node(settings)
    _tune_gc()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, node.request_stop)
    try:
        await node.run()
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


# The cyclic collector's full passes walked every object the process holds (the imported
# frameworks, the heap of due jobs): 40-50 ms each, about once a second at 5k jobs/s, and firing
# stalled meanwhile (measured with gc.callbacks). What exists once the node is built is frozen out
# of the passes, and the young generation is collected less often, so full passes are rare.
GC_THRESHOLDS = (50_000, 20, 20)


def _tune_gc() -> None:
    """Process-wide: called by ``serve`` only, never by a node embedded in another program."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# A stop never hangs on a service: each close is given this long (a broker slow to answer its
# Close, a connection the pool waits for), then left behind (the process is ending).
CLOSE_TIMEOUT_S = 5.0


async def _closed(what: str, closing: Coroutine[Any, Any, None]) -> None:
    started = time.monotonic()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await closing
    except TimeoutError:
        logger.warning(
            "stopping: closing the %s took over %.0fs; left behind",
            what,
            CLOSE_TIMEOUT_S,
            extra={"action": "stop"},
        )
    except Exception as exc:  # a close that failed: the next one must still run
        logger.warning("stopping: closing the %s failed: %r", what, exc, extra={"action": "stop"})
    else:
        if (took_s := time.monotonic() - started) > 1.0:
            logger.info("stopping: closing the %s took %.1fs", what, took_s)
