"""Which broker users may report on which jobs, pure: the format of ``DISPATCHER_EVENT_USERS``.

The SDK sets each events message's AMQP ``user_id`` to the user it connected as, and RabbitMQ
refuses a message whose ``user_id`` is not the connection's: the dispatcher knows who published an
event. With grants set, an event counts only when its publisher holds a grant covering the job's
namespace and routing key; ``history.HistoryStore`` applies them in the recording statement (the
job's namespace lives in PostgreSQL). Unset, any publisher may report on any job (one tenant).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.auth import api_keys

ANY: str = "*"  # the grant of every job
# A broker user name here: anything but the separators of the setting and whitespace.
USER = re.compile(r"^[^\s=,]{1,255}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """One (user, namespace, prefix): the user may report on jobs of that namespace (None: any)
    whose routing key is under that prefix, word by word (None: any)."""

    user: str
    namespace: str | None = None
    prefix: str | None = None


def parse(text: str) -> tuple[Grant, ...]:
    """Parse ``DISPATCHER_EVENT_USERS``: comma-separated ``user=grant``, a user repeated for more
    grants. A grant is ``*`` (every job), ``prefix|prefix`` (routing keys starting with one),
    ``namespace:`` (the namespace's jobs) or ``namespace:prefix|prefix`` (both); the namespace
    and prefixes follow the rules of API keys. Errors name the entry by position."""
    grants: list[Grant] = []
    entries = [entry.strip() for entry in text.split(",")]
    if entries == [""]:
        return ()
    for number, entry in enumerate(entries, start=1):
        user, equals, grant = entry.partition("=")
        if not equals or not USER.match(user):
            raise ValueError(
                f"entry {number}: expected user=grant, the user without spaces, '=' or ','"
            )
        try:
            grants.extend(_grants(user, grant))
        except ValueError as exc:
            raise ValueError(f"entry {number}: {exc}") from None
    return tuple(grants)


def _grants(user: str, grant: str) -> list[Grant]:
    if grant == ANY:
        return [Grant(user=user)]
    namespace_text, colon, prefixes_text = grant.partition(":")
    if not colon:  # prefixes alone (a prefix with a ':' needs the leading ':' of no namespace)
        namespace_text, prefixes_text = "", grant
    prefixes = [prefix for prefix in prefixes_text.split("|") if prefix]
    if not namespace_text and not prefixes:
        raise ValueError(f"a grant names a namespace, prefixes or {ANY!r}, not {grant!r}")
    namespace, checked = api_keys.check_grant(
        api_keys.Scope.PRODUCER, namespace_text or None, prefixes
    )
    if not checked:
        return [Grant(user=user, namespace=namespace)]
    # Whole words, as for API keys (``api_keys.within``): ``billing.`` never reaches ``billingx``.
    return [
        Grant(user=user, namespace=namespace, prefix=api_keys.words(prefix)) for prefix in checked
    ]


def columns(
    grants: Sequence[Grant],
) -> tuple[list[str], list[str | None], list[str | None]]:
    """The grants as the recording statement takes them: users, namespaces, prefixes."""
    return (
        [grant.user for grant in grants],
        [grant.namespace for grant in grants],
        [grant.prefix for grant in grants],
    )
