"""The SDK in a Django project: add ``"consumers_sdk.integrations.django"`` to
``INSTALLED_APPS`` for ``manage.py run_consumer package.module:consumer`` (the flags of
``dispatcher-consumer``), and enqueue jobs in Django's own transaction with
``enqueue_sync(psycopg_connection(), ...)`` inside ``transaction.atomic()``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections

if TYPE_CHECKING:
    import psycopg


def psycopg_connection(using: str = DEFAULT_DB_ALIAS) -> psycopg.Connection[Any]:
    """The psycopg 3 connection under Django's connection ``using``, opened if need be.

    Statements on it run in whatever transaction Django has open there, so a job enqueued with
    it inside ``transaction.atomic(using=using)`` commits or rolls back with the block. Needs
    Django's PostgreSQL backend on psycopg 3 (Django 4.2 or later)."""
    import psycopg  # here, not above: run_consumer works on any database backend

    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        kind = f"{type(raw).__module__}.{type(raw).__qualname__}"
        raise TypeError(f"database {using!r} is not PostgreSQL on psycopg 3 (connection: {kind})")
    return raw
