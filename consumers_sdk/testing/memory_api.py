"""The dispatcher's HTTP API held in memory, for the recording clients (``fake_client``).

It answers the very ``calls.Call``s the real clients send with the documents the node sends, so
the records and the typed errors are the real ones; it keeps what was done for a test to assert
on. It follows the node's rules a test can see (idempotency keys and what a known one does:
keep, replace, extend or refused; when a job lets go of its key; states, the batch limit, the
names it refuses) and leaves out what needs a broker: nothing fires; ``mark`` plays a consumer
(and ``mark(id, "dispatched")`` the dispatch, which lets go of a ``release_key="dispatched"``).
Cron schedules are stored, not planned: their ``next_at`` is None and they show no ``upcoming``.
A bulk action is checked and matches jobs as on the node, but is applied whole when started and
answered ``done`` with its ``touched`` count (the node answers ``running`` and its runner works
it in batches): so stop and resume answer the 409 the node answers for a done action.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import unquote

import orjson

from consumers_sdk import bulk_rules, calls, contract, errors, records, schedule_rules, validation
from consumers_sdk.testing import memory_bulk

T = TypeVar("T")
Clock = Callable[[], datetime]
Document = dict[str, Any]
Handler = Callable[[calls.Call[Any], Sequence[str]], Document]
# What reschedule, replace and extend accept: the states a bulk reschedule changes, those of the
# node's one-job route (cancel and requeue check theirs in ``bulk_rules.APPLIES_TO`` too).
NOT_FIRED = bulk_rules.APPLIES_TO["reschedule"]
FINISHED = ("succeeded", "dead", "cancelled", "expired")  # what lets go of any released key
REPLACED = ("run_at", "payload", "headers", "priority", "ttl_ms")  # what a replace changes
ACTOR = "memory"  # who made a change, in its history step (a real node's id)
CREATOR = "open"  # the key a node without API keys names as an action's maker
ZERO_ID = str(uuid.UUID(int=0))  # a new action's cursor


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _detail(moment: datetime) -> str:
    """A change's history detail, as ``dispatcher_enqueue_v2`` writes it."""
    return f"run_at {moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"


def _json(value: Any) -> Any:
    """What the node stores of a payload: its JSON, read back."""
    return orjson.loads(orjson.dumps(value))


def _refused(kind: type[errors.ClientError], field: str, problem: str) -> errors.ClientError:
    message = f"{field}: {problem}"
    fields = [{"field": field, "message": problem}]
    return kind(422, message, {"error": "invalid_request", "message": message, "fields": fields})


def _prefix_words(params: Mapping[str, object]) -> str | None:
    """``routing_key_prefix`` as the node checks it (``api.jobs``): its words, final dot dropped."""
    if "routing_key_prefix" not in params:
        return None
    if "routing_key" in params:
        raise _refused(
            errors.InvalidJob, "routing_key_prefix", "give routing_key or this, not both"
        )
    words, problem = validation.prefix_words(str(params["routing_key_prefix"]))
    if problem:
        raise _refused(errors.InvalidJob, "routing_key_prefix", problem)
    return words


def _conflict(document: Document, action: str) -> errors.ClientError:
    message = f"cannot {action} a job that is {document['state']}"
    body = {"error": "conflict", "message": message, "state": document["state"]}
    return errors.JobConflict(409, message, body)


def _bulk_conflict(action: Document) -> errors.ClientError:
    message = f"the bulk action is {action['status']}"
    body = {"error": "conflict", "message": message, "state": action["status"]}
    return errors.BulkActionConflict(409, message, body)


def _not_found(kind: type[errors.ClientError], what: str) -> errors.ClientError:
    return kind(404, f"no {what}", {"error": "not_found", "message": f"no {what}"})


def _job_problem(job: Mapping[str, Any], ids: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, problem) of a job the node would refuse; None when it would store it."""
    limits = validation.DEFAULT_LIMITS
    key, ttl_ms, priority = job.get("idempotency_key"), job.get("ttl_ms"), job.get("priority")
    if problem := validation.routing_key_problem(job["routing_key"]):
        return "routing_key", problem
    if found := validation.headers_problem(job.get("headers") or {}, limits):
        return found
    if key is not None and (problem := validation.idempotency_key_problem(key, limits)):
        return "idempotency_key", problem
    on_existing, release_key = job.get("on_existing", "keep"), job.get("release_key", "never")
    if found := validation.key_levers_problem(key, on_existing, release_key):
        return found
    if ttl_ms is not None and (problem := validation.ttl_ms_problem(ttl_ms)):
        return "ttl_ms", problem
    if priority is not None and (problem := validation.priority_problem(priority)):
        return "priority", problem
    if "max_attempts" in job and (problem := validation.max_attempts_problem(job["max_attempts"])):
        return "max_attempts", problem
    if "retry_backoff_s" in job and (
        bad := validation.retry_backoff_problem(job["retry_backoff_s"])
    ):
        return f"retry_backoff_s{bad[0]}", bad[1]
    unknown = [index for index, id_ in enumerate(job.get("after", ())) if id_ not in ids]
    return (f"after[{unknown[0]}]", "no such job") if unknown else None


# bulk actions: the node's checks and states (``bulk_rules``, imported by both), which jobs a
# filter matches (``memory_bulk``, as ``bulk_match`` in the node's
# ``store/queries/bulk_actions.py``) and what its history steps say. The bulk case of
# ``tests/e2e/test_sdk_client.py`` runs on a real node and on this fake, pinning one to the other.


class MemoryAPI:
    """The jobs and schedules of one fake dispatcher, and what was done to them, in order:
    ``scheduled`` (new jobs only: a known idempotency key adds nothing), ``replaced`` and
    ``extended`` (by a known key), ``rescheduled``, ``cancelled``, ``requeued``,
    ``schedules_created``, ``schedules_changed``,
    ``schedules_paused``, ``schedules_resumed``, ``schedules_deleted``, ``bulk_started``; each
    holds the records the client returned (the jobs a bulk action changed are in none of the
    job lists: their history names the action)."""

    def __init__(self, *, max_batch: int = 1000, clock: Clock | None = None) -> None:
        self.max_batch = max_batch
        self._clock = clock or (lambda: datetime.now(UTC))
        self._jobs: dict[str, Document] = {}  # by id, in creation order (ids sort that way too)
        self._history: dict[str, list[Document]] = {}
        self._after: dict[str, tuple[str, ...]] = {}
        self._keys: dict[str, str] = {}  # idempotency key -> the id of the job holding it
        self._schedules: dict[str, Document] = {}
        self._bulk: dict[str, Document] = {}  # by id, in creation order (ids sort that way too)
        self._serial = itertools.count(1)
        self.scheduled: list[records.JobRecord] = []
        self.replaced: list[records.JobRecord] = []
        self.extended: list[records.JobRecord] = []
        self.rescheduled: list[records.JobRecord] = []
        self.cancelled: list[records.JobRecord] = []
        self.requeued: list[records.JobRecord] = []
        self.schedules_created: list[records.Schedule] = []
        self.schedules_changed: list[records.Schedule] = []
        self.schedules_paused: list[records.Schedule] = []
        self.schedules_resumed: list[records.Schedule] = []
        self.schedules_deleted: list[records.Schedule] = []
        self.bulk_started: list[records.BulkAction] = []
        self._routes: dict[tuple[str, tuple[str, ...]], Handler] = {
            ("POST", ("jobs",)): self._create,
            ("POST", ("jobs", "batch")): self._create_batch,
            ("GET", ("jobs",)): self._job_page,
            ("GET", ("jobs", "*")): self._get,
            ("PATCH", ("jobs", "*")): self._reschedule,
            ("DELETE", ("jobs", "*")): self._cancel,
            ("POST", ("jobs", "*", "requeue")): self._requeue,
            ("POST", ("schedules",)): self._create_schedule,
            ("GET", ("schedules",)): self._schedule_page,
            ("GET", ("schedules", "*")): self._get_schedule,
            ("PATCH", ("schedules", "*")): self._change_schedule,
            ("DELETE", ("schedules", "*")): self._delete_schedule,
            ("POST", ("bulk-actions",)): self._create_bulk,
            ("GET", ("bulk-actions",)): self._bulk_page,
            ("GET", ("bulk-actions", "*")): self._get_bulk,
            ("POST", ("bulk-actions", "*", "stop")): self._stop_bulk,
            ("POST", ("bulk-actions", "*", "resume")): self._resume_bulk,
        }

    def answer(self, call: calls.Call[T]) -> T:
        """The record the node would answer ``call`` with, or its typed error."""
        parts = [unquote(part) for part in call.path.removeprefix("/v1/").split("/")]
        for (method, shape), handler in self._routes.items():
            pairs = list(zip(shape, parts, strict=False))
            if (method, len(shape)) == (call.method, len(parts)) and all(
                want in ("*", part) for want, part in pairs
            ):
                return call.parse(handler(call, [part for want, part in pairs if want == "*"]))
        raise NotImplementedError(f"the fake dispatcher has no route for {call.method} {call.path}")

    def mark(self, job_id: str, state: str, *, error: str | None = None) -> records.JobRecord:
        """Play the consumer: the job is now ``state`` (``dispatched``, ``succeeded``, ``dead``
        with ``error``...); a success lets the jobs waiting for it go, and the job lets go of
        its key as its ``release_key`` says."""
        job = self._job(job_id)
        self._move(job, state, last_error=error)
        if state == "succeeded":
            for other_id, after in self._after.items():
                other = self._jobs[other_id]
                done = all(self._jobs[id_]["state"] == "succeeded" for id_ in after)
                if other["state"] == "waiting" and done:
                    self._move(other, "scheduled", event=False)
        return records.job(job)

    # jobs

    def _job(self, job_id: str) -> Document:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise _not_found(errors.JobNotFound, "job has this id") from None

    def _move(self, job: Document, state: str, *, event: bool = True, **changes: Any) -> None:
        now = _text(self._clock())
        job.update(state=state, updated_at=now, **changes)
        if event:
            self._history[job["id"]].append({"event": state, "at": now})
        # As the node's trigger (sql/0019): at the end, or once dispatched if it asked so.
        release = job["release_key"]
        ended = state in FINISHED or (state == "dispatched" and release == "dispatched")
        key = job["idempotency_key"]
        if release != "never" and ended and self._keys.get(key) == job["id"]:
            del self._keys[key]
            job["key_released"] = True

    def _new(self, job: Mapping[str, Any], prefix: str = "") -> Document:
        """A checked job, not stored yet."""
        if problem := _job_problem(job, self._jobs):
            raise _refused(errors.InvalidJob, prefix + problem[0], problem[1])
        now = self._clock()
        run_at = now + timedelta(milliseconds=job.get("delay_ms", 0))
        if "run_at" in job:
            run_at = datetime.fromisoformat(job["run_at"])
        after = tuple(job.get("after", ()))
        waiting = any(self._jobs[id_]["state"] != "succeeded" for id_ in after)
        policy = contract.retry_policy_headers(
            max_attempts=job.get("max_attempts"), backoff_s=job.get("retry_backoff_s")
        )
        return {
            "id": f"00000000-0000-7000-8000-{next(self._serial):012x}",
            "shard": 0,
            "state": "waiting" if waiting else "scheduled",
            "routing_key": job["routing_key"],
            "payload": _json(job["payload"]),
            "run_at": _text(run_at),
            "created_at": _text(now),
            "updated_at": _text(now),
            "dispatched_at": None,
            "idempotency_key": job.get("idempotency_key"),
            "headers": {**(job.get("headers") or {}), **policy},
            "priority": job.get("priority"),
            "ttl_ms": job.get("ttl_ms"),
            "publish_attempts": 0,
            "namespace": None,
            "last_error": None,
            "release_key": job.get("release_key", "never"),
            "key_released": False,
            "after": after,
            "on_existing": job.get("on_existing", "keep"),
        }

    def _store(self, new: Document) -> Document:
        """The job stored, or the one its idempotency key found (changed as ``on_existing``
        asks), with ``created`` and ``outcome``."""
        how = new.pop("on_existing")
        known = self._keys.get(new["idempotency_key"] or "")
        if known is not None:
            return self._existing(self._jobs[known], new, how)
        self._after[new["id"]] = new.pop("after")
        self._jobs[new["id"]] = new
        self._history[new["id"]] = [{"event": "scheduled", "at": new["created_at"]}]
        if new["idempotency_key"] is not None:
            self._keys[new["idempotency_key"]] = new["id"]
        answer = {**new, "created": True, "outcome": "created"}
        self.scheduled.append(records.job(answer))
        return answer

    def _existing(self, job: Document, new: Document, how: str) -> Document:
        """``dispatcher_enqueue_v2`` on the job a key names: kept, or changed while pending under
        the same routing key (replace: the new time and contents; extend: a later time only),
        else refused and answered unchanged."""
        pending = job["state"] in NOT_FIRED and job["routing_key"] == new["routing_key"]
        later = datetime.fromisoformat(new["run_at"]) > datetime.fromisoformat(job["run_at"])
        if how == "keep" or (how == "extend" and pending and not later):
            outcome = "kept"
        elif not pending:
            outcome = "refused"
        else:
            outcome = "replaced" if how == "replace" else "extended"
            fields = REPLACED if how == "replace" else ("run_at",)
            job.update({field: new[field] for field in fields}, updated_at=_text(self._clock()))
            step = {
                "event": outcome,
                "at": job["updated_at"],
                "attempt": 0,
                "group": "dispatcher",
                "consumer": ACTOR,
                "detail": _detail(datetime.fromisoformat(job["run_at"])),
            }
            self._history[job["id"]].append(step)
            (self.replaced if how == "replace" else self.extended).append(records.job(job))
        return {**job, "created": False, "outcome": outcome}

    def _create(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        return self._store(self._new(call.json))

    def _create_batch(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        jobs = call.json["jobs"]
        if len(jobs) > self.max_batch:
            raise _refused(errors.InvalidJob, "jobs", f"at most {self.max_batch} jobs per batch")
        keys: dict[str, int] = {}
        for index, job in enumerate(jobs):
            key = job.get("idempotency_key")
            if key in keys:
                problem = f"repeats the key of jobs[{keys[key]}]"
                raise _refused(errors.InvalidJob, f"jobs[{index}].idempotency_key", problem)
            if key is not None:
                keys[key] = index
        checked = [self._new(job, f"jobs[{index}].") for index, job in enumerate(jobs)]
        return {"jobs": [self._store(job) for job in checked]}  # every one checked: all or none

    def _get(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        job = self._job(found[0])
        after = self._after[job["id"]]
        pending = [id_ for id_ in after if self._jobs[id_]["state"] != "succeeded"]
        return {**job, "history": self._history[job["id"]], "after": after, "pending": pending}

    def _job_page(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        params = call.params
        if "idempotency_key" in params:  # the job holding it, then those that let go, newest first
            key = str(params["idempotency_key"])
            holder = [self._jobs[self._keys[key]]] if key in self._keys else []
            released = [
                job
                for job in reversed(self._jobs.values())
                if job["idempotency_key"] == key and job["key_released"]
            ]
            return {"jobs": [*holder, *released][:10], "next_after": None}
        after, limit = str(params.get("after", "")), int(str(params.get("limit", 100)))
        prefix = _prefix_words(params)
        due_order = params.get("state") == "scheduled"  # as the service pages them
        jobs = sorted(self._jobs.values(), key=lambda job: _place(job, due_order))
        cursor = self._jobs.get(after)
        # A cursor the service does not find starts a page of scheduled jobs from the first.
        start = _place(cursor, due_order) if cursor else ("", "" if due_order else after)
        page = [
            job
            for job in jobs
            if _place(job, due_order) > start
            and params.get("state", job["state"]) == job["state"]
            and params.get("routing_key", job["routing_key"]) == job["routing_key"]
            and (prefix is None or memory_bulk.within(job["routing_key"], prefix))
        ][:limit]
        return {"jobs": page, "next_after": page[-1]["id"] if len(page) == limit else None}

    def _reschedule(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        job, change = self._job(found[0]), dict(call.json)
        if job["state"] not in NOT_FIRED:
            raise _conflict(job, "reschedule")
        if "delay_ms" in change:
            job["run_at"] = _text(self._clock() + timedelta(milliseconds=change["delay_ms"]))
        if "run_at" in change:
            job["run_at"] = _text(datetime.fromisoformat(change["run_at"]))
        job.update({key: change[key] for key in ("payload", "priority") if key in change})
        job.update(payload=_json(job["payload"]), updated_at=_text(self._clock()))
        self.rescheduled.append(records.job(job))
        return job

    def _cancel(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        job = self._job(found[0])
        if job["state"] not in bulk_rules.APPLIES_TO["cancel"]:
            raise _conflict(job, "cancel")
        self._cancelled(job)
        self.cancelled.append(records.job(job))
        return job

    def _cancelled(self, job: Document, **step: Any) -> None:
        """Cancel a job (its history step with ``step``), and the jobs waiting for it."""
        self._move(job, "cancelled", event=False)
        self._history[job["id"]].append({"event": "cancelled", "at": job["updated_at"], **step})
        for other_id, after in self._after.items():  # what waits for it can never run
            if job["id"] in after and self._jobs[other_id]["state"] == "waiting":
                self._move(self._jobs[other_id], "cancelled")

    def _requeue(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        job = self._job(found[0])
        if job["state"] not in bulk_rules.APPLIES_TO["requeue"]:
            raise _conflict(job, "requeue")
        self._requeued(job)
        self.requeued.append(records.job(job))
        return job

    def _requeued(self, job: Document, **step: Any) -> None:
        """A dead job scheduled again, due now (its history step with ``step``)."""
        now = _text(self._clock())
        self._move(job, "scheduled", event=False, run_at=now, last_error=None, dispatched_at=None)
        self._history[job["id"]].append({"event": "requeued", "at": job["updated_at"], **step})

    # recurring schedules

    def _schedule(self, name: str) -> Document:
        try:
            return self._schedules[name]
        except KeyError:
            raise _not_found(errors.ScheduleNotFound, "schedule has this name") from None

    def _timed(self, schedule: Document) -> None:
        """Check the timing as the node does; an interval goes on from now, cron is not planned."""
        if schedule["cron"] is None and schedule["interval_s"] is None:
            raise _refused(errors.InvalidSchedule, "cron", "give cron or interval_s")
        if schedule["cron"] is not None and schedule["interval_s"] is not None:
            raise _refused(
                errors.InvalidSchedule, "interval_s", "give cron or interval_s, not both"
            )
        start_at = datetime.fromisoformat(schedule["start_at"])
        now = self._clock()
        schedule["next_at"] = None if schedule["cron"] else _text(max(now, start_at))

    def _template(self, job: Mapping[str, Any]) -> Document:
        if problem := validation.routing_key_problem(job["routing_key"]):
            raise _refused(errors.InvalidSchedule, "job.routing_key", problem)
        return {**job, "payload": _json(job["payload"])}

    def _create_schedule(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        body, now = call.json, _text(self._clock())
        if problem := schedule_rules.name_problem(body["name"]):
            raise _refused(errors.InvalidSchedule, "name", problem)
        schedule: Document = {
            "id": next(self._serial),
            "name": body["name"],
            "namespace": None,
            "cron": body.get("cron"),
            "timezone": body.get("timezone", schedule_rules.DEFAULT_TIMEZONE),
            "interval_s": body.get("interval_s"),
            "job": self._template(body["job"]),
            "start_at": body.get("start_at", now),
            "end_at": body.get("end_at"),
            "missed": body.get("missed", schedule_rules.DEFAULT_MISSED),
            "grace_s": float(body.get("grace_s", schedule_rules.DEFAULT_GRACE_S)),
            "paused": body.get("paused", False),
            "last_fired_at": None,
            "created_at": now,
            "updated_at": now,
            "error": None,
        }
        self._timed(schedule)
        if schedule["name"] in self._schedules:
            message = f"a schedule named {schedule['name']} exists"
            fields = [{"field": "name", "message": message}]
            body = {"error": "conflict", "message": message, "fields": fields}
            raise errors.ScheduleConflict(409, message, body)
        self._schedules[schedule["name"]] = schedule
        self.schedules_created.append(records.schedule(schedule))
        return schedule

    def _get_schedule(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        schedule = self._schedule(found[0])
        upcoming: list[str] = []
        if not schedule["paused"] and schedule["next_at"] is not None and schedule["interval_s"]:
            first, step = datetime.fromisoformat(schedule["next_at"]), schedule["interval_s"]
            upcoming = [
                _text(first + timedelta(seconds=step * k)) for k in range(schedule_rules.UPCOMING)
            ]
        return {**schedule, "upcoming": upcoming}

    def _schedule_page(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        after, limit = (
            int(str(call.params.get("after", 0))),
            int(str(call.params.get("limit", 100))),
        )
        page = [schedule for schedule in self._schedules.values() if schedule["id"] > after][:limit]
        return {"schedules": page, "next_after": page[-1]["id"] if len(page) == limit else None}

    def _change_schedule(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        schedule, change = self._schedule(found[0]), dict(call.json)
        merged = {**schedule, **change}
        if "cron" in change and "interval_s" not in change:
            merged["interval_s"] = None  # switching to cron, and the other way round
        if "interval_s" in change and "cron" not in change:
            merged["cron"] = None
        if "job" in change:
            merged["job"] = self._template(change["job"])
        timing = ("cron", "interval_s", "timezone")
        if any(merged[key] != schedule[key] for key in timing) or (
            schedule["paused"] and not merged["paused"]
        ):
            self._timed(merged)  # a new timing, or a resume, goes on from now
        merged["updated_at"] = _text(self._clock())
        schedule.update(merged)
        if change == {"paused": True}:
            self.schedules_paused.append(records.schedule(schedule))
        elif change == {"paused": False}:
            self.schedules_resumed.append(records.schedule(schedule))
        else:
            self.schedules_changed.append(records.schedule(schedule))
        return schedule

    def _delete_schedule(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        schedule = self._schedules.pop(self._schedule(found[0])["name"])
        self.schedules_deleted.append(records.schedule(schedule))
        return schedule

    # bulk actions

    def _create_bulk(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        body, now = call.json, self._clock()
        plan = memory_bulk.plan(body, now)
        matched = [job for job in self._jobs.values() if memory_bulk.matches(job, plan.filter)]
        if body.get("dry_run"):
            sample = matched[: bulk_rules.SAMPLE_SIZE]
            return {
                "action": plan.action,
                "matched": len(matched),
                "matched_at_least": False,  # the fake counts every job it holds
                "sample": sample,
            }
        action: Document = {
            "id": f"00000000-0000-7000-b000-{next(self._serial):012x}",
            "action": plan.action,
            "status": "done",
            "reason": None,
            "filter": memory_bulk.filter_document(plan.filter),
            "run_at": _text(plan.run_at) if plan.run_at else None,
            "shift_s": plan.shift_s,
            "touched": len(matched),
            "matched_estimate": len(matched),
            "cursor": matched[-1]["id"] if matched else ZERO_ID,
            "created_by": CREATOR,
            "worked_by": None,
            "created_at": _text(now),
            "updated_at": _text(now),
            "finished_at": _text(now),
        }
        for job in matched:
            self._apply(action["id"], plan, job)
        self._bulk[action["id"]] = action
        self.bulk_started.append(records.bulk_action(action))
        return action

    def _apply(self, action_id: str, plan: memory_bulk.Plan, job: Document) -> None:
        """What the node's batch does to one job it matched, with its history step."""
        step = {"attempt": 0, "group": "dispatcher", "consumer": ACTOR}
        if plan.action == "cancel":
            self._cancelled(job, **step, detail=bulk_rules.detail(action_id, plan.action))
        elif plan.action == "requeue":
            self._requeued(job, **step, detail=bulk_rules.detail(action_id, plan.action))
        else:
            epoch = datetime.fromtimestamp(0, UTC)
            moved = plan.run_at or max(
                datetime.fromisoformat(job["run_at"]) + timedelta(seconds=plan.shift_s or 0),
                epoch,
            )
            job.update(run_at=_text(moved), updated_at=_text(self._clock()))
            detail = memory_bulk.moved_detail(action_id, moved)
            self._history[job["id"]].append(
                {"event": "rescheduled", "at": job["updated_at"], **step, "detail": detail}
            )

    def _bulk_action(self, action_id: str) -> Document:
        try:
            return self._bulk[action_id]
        except KeyError:
            raise _not_found(errors.BulkActionNotFound, "bulk action has this id") from None

    def _get_bulk(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        return self._bulk_action(found[0])

    def _bulk_page(self, call: calls.Call[Any], _: Sequence[str]) -> Document:
        before, limit = call.params.get("before"), int(str(call.params.get("limit", 100)))
        newest = [
            action
            for action in reversed(self._bulk.values())
            if before is None or action["id"] < str(before)
        ][:limit]
        next_before = newest[-1]["id"] if len(newest) == limit else None
        return {"bulk_actions": newest, "next_before": next_before}

    def _stop_bulk(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        raise _bulk_conflict(self._bulk_action(found[0]))  # every fake action is done

    def _resume_bulk(self, call: calls.Call[Any], found: Sequence[str]) -> Document:
        raise _bulk_conflict(self._bulk_action(found[0]))


def _place(job: Document, due_order: bool) -> tuple[str, str]:
    """A job's place in a page: by id, or scheduled jobs by run_at, then id."""
    return (job["run_at"], job["id"]) if due_order else ("", job["id"])
