"""API keys, pure: tokens and their hashes, scopes, the Principal a key grants, and the format
of ``DISPATCHER_API_KEYS``. No I/O; ``store.api_keys`` keeps the hashed keys, ``keyring``
resolves them.

A token is never stored, logged or compared as plaintext: only its SHA-256 is kept. The tokens
we make carry 256 random bits, so an unsalted fast hash is enough (nothing to brute-force).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from consumers_sdk import validation

TOKEN_PREFIX = "dk_"
MIN_STATIC_TOKEN_LENGTH = 16
# A prefix of a routing key (see api.schemas.ROUTING_KEY): whole words, with or without the dot
# after them (``billing`` and ``billing.`` both admit ``billing.invoice``, not ``billingx``).
ROUTING_KEY_PREFIX = re.compile(r"[A-Za-z0-9_\-:.]{1,255}")
# What a static token may hold: the separators of DISPATCHER_API_KEYS are excluded.
STATIC_TOKEN = re.compile(r"[^\s:,]+")


class Scope(StrEnum):
    """What a key may do. An admin may do everything the others may."""

    PRODUCER = "producer"  # submit, read, list and cancel jobs of its namespace
    MONITOR = "monitor"  # /readyz and /metrics only (for probes and Prometheus)
    ADMIN = "admin"  # everything: every namespace, /v1/cluster, /metrics
    LIMITS = "limits"  # pause and resume the routing keys of its namespace (/v1/limits)


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: what a valid key grants. ``key`` names the key for logs (never the token)."""

    key: str
    scope: Scope
    namespace: str | None = None  # None: the default namespace
    routing_key_prefixes: tuple[str, ...] = ()  # empty: any routing key

    def has(self, scope: Scope) -> bool:
        return self.scope is Scope.ADMIN or self.scope is scope

    @property
    def namespace_filter(self) -> str | None:
        """What the store filters jobs on: None for every namespace (admin), "" for the default."""
        return None if self.scope is Scope.ADMIN else (self.namespace or "")

    @property
    def routing_key_filter(self) -> list[str] | None:
        """The words the store filters jobs and schedules on (``within`` in SQL); None: any."""
        if self.scope is Scope.ADMIN or not self.routing_key_prefixes:
            return None
        return [words(prefix) for prefix in self.routing_key_prefixes]

    def may_route(self, routing_key: str) -> bool:
        """Whether this key may create, read or change a job or schedule of ``routing_key``."""
        allowed = self.routing_key_filter
        return allowed is None or any(within(routing_key, prefix) for prefix in allowed)


def words(prefix: str) -> str:
    """A prefix as the whole words it names: ``billing.`` and ``billing`` are the same prefix."""
    return prefix.rstrip(".")


def within(routing_key: str, prefix_words: str) -> bool:
    """Whether ``routing_key`` is ``prefix_words`` or below it, word by word: ``billing`` admits
    ``billing`` and ``billing.invoice``, never ``billingx.invoice``. The store's queries apply the
    same rule in SQL (``routing_key = p OR starts_with(routing_key, p || '.')``); a test pins them
    together."""
    return routing_key == prefix_words or routing_key.startswith(prefix_words + ".")


# Auth is off (no key configured): every caller may do everything, as before keys existed.
OPEN_ACCESS = Principal(key="open", scope=Scope.ADMIN)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKey:
    """A key stored in PostgreSQL, without its hash."""

    id: int
    name: str
    scope: Scope
    namespace: str | None
    routing_key_prefixes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    def principal(self) -> Principal:
        return Principal(
            key=f"db:{self.id}",
            scope=self.scope,
            namespace=self.namespace,
            routing_key_prefixes=self.routing_key_prefixes,
        )


def new_token() -> str:
    """A fresh high-entropy token (256 bits), shown once to whoever creates the key."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


# The scopes bound to one namespace and, optionally, to routing-key prefixes.
NAMESPACED = frozenset({Scope.PRODUCER, Scope.LIMITS})


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def check_grant(
    scope: Scope, namespace: str | None, routing_key_prefixes: Sequence[str]
) -> tuple[str | None, tuple[str, ...]]:
    """Validate what a key grants; ValueError names what is wrong (never the token)."""
    if scope not in NAMESPACED and (namespace or routing_key_prefixes):
        raise ValueError(
            f"only producer and limits keys take a namespace or routing-key prefixes, not {scope}"
        )
    if namespace is not None and (problem := validation.namespace_problem(namespace)):
        raise ValueError(problem)
    for prefix in routing_key_prefixes:
        if not ROUTING_KEY_PREFIX.fullmatch(prefix):
            raise ValueError("a routing-key prefix is 1-255 letters, digits, '_', '-', ':' or '.'")
        if not words(prefix) or prefix.startswith("."):
            raise ValueError("a routing-key prefix starts with a word (billing or billing.)")
    return namespace, tuple(routing_key_prefixes)


@dataclass(frozen=True, slots=True)
class StaticKey:
    digest: bytes
    principal: Principal


def parse_static(text: str) -> list[StaticKey]:
    """Parse ``DISPATCHER_API_KEYS``: comma-separated ``token:scope[:namespace[:prefix|prefix]]``.

    Errors name the entry by position, never by its token."""
    parsed: list[StaticKey] = []
    seen: set[bytes] = set()
    entries = [entry.strip() for entry in text.split(",")]
    for number, entry in enumerate(entries, start=1):
        if not entry:
            if len(entries) > 1:
                raise ValueError(f"entry {number} is empty")
            continue
        token, _, grant = entry.partition(":")
        scope_name, _, rest = grant.partition(":")
        namespace, _, prefixes = rest.partition(":")
        if len(token) < MIN_STATIC_TOKEN_LENGTH or not STATIC_TOKEN.fullmatch(token):
            raise ValueError(
                f"entry {number}: the token must be at least {MIN_STATIC_TOKEN_LENGTH} characters"
                " without spaces, ':' or ','"
            )
        try:
            scope = Scope(scope_name)
        except ValueError:
            raise ValueError(
                f"entry {number}: scope must be one of {', '.join(Scope)}, not {scope_name!r}"
            ) from None
        try:
            grant_namespace, grant_prefixes = check_grant(
                scope, namespace or None, [p for p in prefixes.split("|") if p]
            )
        except ValueError as exc:
            raise ValueError(f"entry {number}: {exc}") from None
        key = digest(token)
        if key in seen:
            raise ValueError(f"entry {number} repeats the token of an earlier entry")
        seen.add(key)
        principal = Principal(
            key=f"static:{number}",
            scope=scope,
            namespace=grant_namespace,
            routing_key_prefixes=grant_prefixes,
        )
        parsed.append(StaticKey(key, principal))
    return parsed
