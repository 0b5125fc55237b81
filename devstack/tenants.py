"""The tenants `make run`, `make cluster` and `make cluster-ha` start with, isolated on the broker
as docs/concepts/job-life.md ("Tenants on one broker") sets them up: each tenant's consumer user
may bind, read and report on its own routing-key prefix only, and the nodes count an event only
from a user granted its job (``DISPATCHER_EVENT_USERS``).

guest, the broker's administrator here (as the dispatcher's own user), is granted every job: the
tutorials' consumers connect as guest, so every first step works as written. A tenant's consumer
connects as ``<tenant>-consumer`` (its password the same; a local stack only) with the tenant as
its group and routing-key prefix (``billing.invoice.send`` for ``billing``).
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from consumers_sdk import contract

TENANTS = ("billing", "payments")
OPERATOR = "guest"  # every permission, every job: the dispatcher's and the tutorials' user


def user(tenant: str) -> str:
    return f"{tenant}-consumer"


def url(amqp_port: int, tenant: str, vhost: str = "/") -> str:
    name = user(tenant)
    return f"amqp://{name}:{name}@127.0.0.1:{amqp_port}/{quote(vhost, safe='')}"


def permissions(tenant: str) -> dict[str, dict[str, str]]:
    """The docs' commands for TENANT (its group and routing-key prefix): ``set_permissions``
    (configure, write, read), then ``set_topic_permissions`` per exchange (write, read)."""
    return {
        "permissions": {
            "configure": rf"^{tenant}\.",
            "write": rf"^({tenant}\..*|amq\.default|dispatcher\.events)$",
            "read": rf"^({tenant}\..*|dispatcher\.jobs)$",
        },
        contract.EXCHANGE: {"write": "^$", "read": rf"^{tenant}\."},
        contract.EVENTS_EXCHANGE: {"write": rf"^{tenant}\.", "read": "^$"},
    }


def event_users() -> str:
    """``DISPATCHER_EVENT_USERS`` for the nodes: the operator every job, each tenant's user the
    jobs under its prefix."""
    return ",".join([f"{OPERATOR}=*", *(f"{user(t)}={t}." for t in TENANTS)])


def apply(management_url: str, vhost: str = "/") -> None:
    """Create (or set again) every tenant's user with its permissions on VHOST, through the
    management API as guest. Run on every start: a stack made before keeps up with this file."""
    quoted = quote(vhost, safe="")
    with httpx.Client(base_url=management_url, auth=("guest", "guest"), timeout=30) as http:

        def put(path: str, body: dict[str, str]) -> None:
            http.put(path, json=body).raise_for_status()

        for tenant in TENANTS:
            name = quote(user(tenant), safe="")
            put(f"/api/users/{name}", {"password": user(tenant), "tags": ""})
            granted = permissions(tenant)
            put(f"/api/permissions/{quoted}/{name}", granted.pop("permissions"))
            for exchange, topic in granted.items():
                put(f"/api/topic-permissions/{quoted}/{name}", {"exchange": exchange, **topic})
