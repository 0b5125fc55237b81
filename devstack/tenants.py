"""The tenants `make run`, `make cluster`, `make cluster-ha` and the compose files start with,
isolated on the broker as docs/concepts/job-life.md ("Tenants on one broker") sets them up: each
tenant's consumer user may bind, read and report on its own routing-key prefix only, and the nodes
count an event only from a user granted its job (``DISPATCHER_EVENT_USERS``).

The broker's administrator (guest here, ``dispatcher`` in compose.yaml), the dispatcher's own
user, is granted every job: the tutorials' consumers connect as guest, so every first step works
as written. A tenant's consumer connects as ``<tenant>-consumer`` with the tenant as its group and
routing-key prefix (``billing.invoice.send`` for ``billing``); its password is its name on a local
stack, a required secret in compose.yaml and compose.ha.yaml.

Compose's ``broker-tenants`` service runs this file as a script in the dispatcher's image (see
``main``): it imports only what that image holds, the standard library, httpx and the SDK
(tests/unit/test_compose_tenants.py checks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

import httpx

from consumers_sdk import contract

TENANTS = ("billing", "payments")
OPERATOR = "guest"  # every permission, every job: the dispatcher's and the tutorials' user
# Where compose's broker-tenants service finds the management API and its administrator.
MANAGEMENT_URL_VARIABLE = "RABBITMQ_MANAGEMENT_URL"
MANAGEMENT_WAIT_S = 120.0  # healthy means AMQP answers; the management API may lag


def user(tenant: str) -> str:
    return f"{tenant}-consumer"


def password_variable(tenant: str) -> str:
    """The variable compose reads TENANT's user's password from: ``BILLING_CONSUMER_PASSWORD``."""
    return f"{user(tenant).upper().replace('-', '_')}_PASSWORD"


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


def event_users(operator: str = OPERATOR) -> str:
    """``DISPATCHER_EVENT_USERS`` for the nodes: OPERATOR (the broker's administrator) every job,
    each tenant's user the jobs under its prefix."""
    return ",".join([f"{operator}=*", *(f"{user(t)}={t}." for t in TENANTS)])


def apply(
    management_url: str,
    vhost: str = "/",
    *,
    admin: tuple[str, str] = (OPERATOR, OPERATOR),
    passwords: Mapping[str, str] | None = None,
) -> None:
    """Create (or set again) every tenant's user with its permissions on VHOST, through the
    management API as ADMIN; PASSWORDS by tenant, else each user's name (a local stack). Run on
    every start: a stack made before keeps up with this file."""
    quoted = quote(vhost, safe="")
    with httpx.Client(base_url=management_url, auth=admin, timeout=30) as http:

        def put(path: str, body: dict[str, str]) -> None:
            http.put(path, json=body).raise_for_status()

        for tenant in TENANTS:
            name = quote(user(tenant), safe="")
            password = user(tenant) if passwords is None else passwords[tenant]
            put(f"/api/users/{name}", {"password": password, "tags": ""})
            granted = permissions(tenant)
            put(f"/api/permissions/{quoted}/{name}", granted.pop("permissions"))
            for exchange, topic in granted.items():
                put(f"/api/topic-permissions/{quoted}/{name}", {"exchange": exchange, **topic})


def wait_for_management(management_url: str, deadline_s: float) -> None:
    """Until the management API answers at all: compose calls the broker healthy once its AMQP
    port answers, which need not mean its management API does yet."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            httpx.get(f"{management_url}/api/overview", timeout=5)
            return
        except httpx.TransportError:
            if time.monotonic() > end:
                raise
        time.sleep(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What compose's ``broker-tenants`` applies the tenants to, read from its environment."""

    management_url: str  # without credentials
    admin: tuple[str, str]  # the broker's administrator: user, password
    passwords: dict[str, str]  # by tenant


def target(environ: Mapping[str, str]) -> Target:
    """``RABBITMQ_MANAGEMENT_URL`` gives the management API with its administrator's credentials
    (``http://user:password@rabbitmq:15672``), each user's password its variable
    (``password_variable``); a missing one exits naming it."""
    missing = [
        name
        for name in (MANAGEMENT_URL_VARIABLE, *map(password_variable, TENANTS))
        if not environ.get(name)
    ]
    if missing:
        raise SystemExit(f"broker-tenants: set {', '.join(missing)}")
    parts = urlsplit(environ[MANAGEMENT_URL_VARIABLE])
    if parts.username is None or parts.password is None or parts.hostname is None:
        raise SystemExit(f"broker-tenants: {MANAGEMENT_URL_VARIABLE} needs user:password@host")
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return Target(
        management_url=parts._replace(netloc=netloc).geturl().rstrip("/"),
        admin=(unquote(parts.username), unquote(parts.password)),
        passwords={tenant: environ[password_variable(tenant)] for tenant in TENANTS},
    )


def main(environ: Mapping[str, str]) -> None:
    """Compose's ``broker-tenants``: apply every tenant to vhost / of the broker ENVIRON names."""
    found = target(environ)
    wait_for_management(found.management_url, MANAGEMENT_WAIT_S)
    apply(found.management_url, admin=found.admin, passwords=found.passwords)
    made = ", ".join(f"{user(t)} ({t}.*)" for t in TENANTS)
    print(f"broker-tenants: {made} on vhost / of {found.management_url}")


if __name__ == "__main__":
    main(os.environ)
