"""Who may call each route and what body it takes: one table, read by the gate before a byte of
the body is read. The routes declare their scope to FastAPI too (``auth.Producer``...), for an
app served without the gate and for the OpenAPI document; a test holds the table equal to the
routes the app serves, both ways, and the table's matching equal to the router's.

A path template is matched as the router matches it: ``{name}`` takes one non-empty segment,
``{name:path}`` (a mounted app) the rest of the path. The first entry whose template and method
match wins, in the order the router tries its routes; a path some entry matches with another
method (the router answers 405) takes the first such entry's rule."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dispatcher.auth.api_keys import Scope


class Body(enum.Enum):
    """What a route reads from the body, which bounds it (``gate.Rules``)."""

    SMALL = "small"  # nothing: a path and a key are all it needs
    DOCUMENT = "document"  # one job, one change of a job, one schedule
    BATCH = "batch"  # up to ``max_batch`` jobs


@dataclass(frozen=True, slots=True)
class Access:
    """What a route asks of a request before its body is read."""

    needs_key: bool
    scope: Scope | None = None  # None: any valid key will do (or none, when open)
    body: Body = Body.SMALL


OPEN = Access(needs_key=False)
ANY_KEY = Access(needs_key=True)
PRODUCER = Access(needs_key=True, scope=Scope.PRODUCER)
PRODUCER_DOCUMENT = Access(needs_key=True, scope=Scope.PRODUCER, body=Body.DOCUMENT)
MONITOR = Access(needs_key=True, scope=Scope.MONITOR)
ADMIN = Access(needs_key=True, scope=Scope.ADMIN)
LIMITS = Access(needs_key=True, scope=Scope.LIMITS)
LIMITS_DOCUMENT = Access(needs_key=True, scope=Scope.LIMITS, body=Body.DOCUMENT)

# (method, path template) -> access, in the order the app's router tries its routes. A route
# that serves GET also answers HEAD (Starlette's): HEAD takes the GET entry's rule.
ROUTES: Mapping[tuple[str, str], Access] = {
    # FastAPI's own: the OpenAPI document and its readers, served to anyone.
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/docs/oauth2-redirect"): OPEN,
    ("GET", "/redoc"): OPEN,
    ("GET", "/docs-assets/{path:path}"): OPEN,  # /docs's JS and CSS (no CDN)
    # /v1/jobs (api/jobs.py)
    ("POST", "/v1/jobs"): PRODUCER_DOCUMENT,
    ("POST", "/v1/jobs/batch"): Access(needs_key=True, scope=Scope.PRODUCER, body=Body.BATCH),
    ("GET", "/v1/jobs/{job_id}"): PRODUCER,
    ("PATCH", "/v1/jobs/{job_id}"): PRODUCER_DOCUMENT,
    ("POST", "/v1/jobs/{job_id}/requeue"): ADMIN,
    ("DELETE", "/v1/jobs/{job_id}"): PRODUCER,
    ("GET", "/v1/jobs"): PRODUCER,
    # /v1/schedules (api/schedules.py)
    ("POST", "/v1/schedules"): PRODUCER_DOCUMENT,
    ("GET", "/v1/schedules"): PRODUCER,
    ("GET", "/v1/schedules/{name}"): PRODUCER,
    ("PATCH", "/v1/schedules/{name}"): PRODUCER_DOCUMENT,
    ("DELETE", "/v1/schedules/{name}"): PRODUCER,
    # /v1/limits (api/limits.py): flow rules
    ("GET", "/v1/limits"): LIMITS,
    ("GET", "/v1/limits/{key}"): LIMITS,
    ("PUT", "/v1/limits/{key}"): LIMITS_DOCUMENT,
    ("DELETE", "/v1/limits/{key}"): LIMITS,
    ("POST", "/v1/limits/{key}/pause"): LIMITS_DOCUMENT,
    ("POST", "/v1/limits/{key}/resume"): LIMITS,
    # /v1/bulk-actions (api/bulk_actions.py): a requeue needs an admin's key (checked there)
    ("POST", "/v1/bulk-actions"): PRODUCER_DOCUMENT,
    ("GET", "/v1/bulk-actions"): PRODUCER,
    ("GET", "/v1/bulk-actions/{action_id}"): PRODUCER,
    ("POST", "/v1/bulk-actions/{action_id}/stop"): PRODUCER,
    ("POST", "/v1/bulk-actions/{action_id}/resume"): PRODUCER,
    # operations (api/ops.py): probes see a live node without a key; readiness needs one.
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): ANY_KEY,
    ("GET", "/metrics"): MONITOR,
    ("GET", "/v1/stats"): MONITOR,
    ("GET", "/v1/queues"): MONITOR,
    ("GET", "/v1/cluster"): ADMIN,
    # The console's static files hold no data: every figure comes from the API with a key.
    ("GET", "/console/{path:path}"): OPEN,
}
UNKNOWN = OPEN  # a path no entry matches: the router answers 404 (or redirects a slash)

_PARAMETER = re.compile(r"{([^}:]+)(:path)?}")


def _pattern(template: str) -> re.Pattern[str]:
    """The template as a regular expression over the whole path."""
    parts: list[str] = []
    at = 0
    for found in _PARAMETER.finditer(template):
        parts.append(re.escape(template[at : found.start()]))
        parts.append(".*" if found.group(2) else "[^/]+")
        at = found.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts) + r"\Z")


@dataclass(frozen=True, slots=True)
class Found:
    """The access of a request's route; ``fixed`` when the method and path are an entry's own (a
    route without parameters), so a cache of such finds holds no more entries than the table."""

    access: Access
    fixed: bool


class Table:
    """The table compiled for matching requests."""

    def __init__(self, routes: Mapping[tuple[str, str], Access] = ROUTES) -> None:
        self._entries = [
            (method, template, _pattern(template), access)
            for (method, template), access in routes.items()
        ]

    def find(self, method: str, path: str) -> Found:
        partial: Found | None = None
        for entry_method, template, pattern, access in self._entries:
            if pattern.match(path) is None:
                continue
            if entry_method == method:
                return Found(access, fixed=path == template)
            if partial is None:
                partial = Found(access, fixed=False)
        return partial or Found(UNKNOWN, fixed=False)

    def templates(self) -> Iterator[tuple[str, str]]:
        return ((method, template) for method, template, _, _ in self._entries)
