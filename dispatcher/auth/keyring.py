"""Keyring: resolves a bearer token to the Principal it grants, from the static keys of the
settings and the keys stored in PostgreSQL.

Auth is on when a static key is configured, when ``api_auth_required`` is set, or once a key was
ever created in the database (a fact that never becomes false: keys are revoked, not deleted).

The node holds every live stored key's hash in memory, so any token, known or not, is answered
from memory: a flood of random tokens costs no query and cannot crowd out a real key (there is
no lookup budget to exhaust). The set is loaded by one query, reloaded at once after a key notice
(``KEYS_CHANNEL``, sent by the statement that creates or revokes a key) and after every reconnect
of the notice listener (notices sent meanwhile are lost), and at least every ``cache_s`` in case a
notice was missed. Concurrent requests share one load.

A set past ``cache_s`` is never used: while PostgreSQL is unreachable a stored key gets 503
(static keys keep working), and an open node whose last load found no key stays open.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dispatcher import errors
from dispatcher.auth import api_keys
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.listen import ChannelListener
from dispatcher.timing.kinds import Mono

# Notified by queries.api_keys.INSERT_API_KEY and REVOKE_API_KEY.
KEYS_CHANNEL: Final = "dispatcher_keys"
# How long after a load of the keys began requests wait for it (it goes on without them): a node
# cut from PostgreSQL answers 503 (or, open, goes on open) within a second, not after the pool's
# timeout, and a request arriving later while the load still hangs (the browser guard's and the
# gate's looks at one request, the next /readyz) waits no more; /readyz above all must answer
# while the database is away.
LOAD_WAIT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Loaded:
    """The stored keys as of one load."""

    live: dict[bytes, api_keys.Principal]  # by token hash
    ever: bool  # a key was ever created: auth is on
    valid_until: float  # on the keyring's clock; 0 once a notice says it may be out of date


class Keyring:
    def __init__(
        self,
        *,
        static: Sequence[api_keys.StaticKey],
        store: KeyStore,
        cache_s: float,
        required: bool = False,
        mono: Mono = time.monotonic,
    ) -> None:
        self._static = tuple(static)
        self._store = store
        self._cache_s = cache_s
        self._required = required or bool(self._static)
        self._mono = mono
        self._keys_exist = False  # once seen true, true for good
        self._loaded: Loaded | None = None
        self._loading: asyncio.Future[Loaded] | None = None  # the load every caller shares
        self._loading_since = 0.0  # on the keyring's clock
        # Bumped by ``forget``: a load that started before is not trusted past its first use.
        self._generation = 0

    def listen(self, listener: ChannelListener) -> None:
        """Reload on each key notice and each reconnect of ``listener``."""
        listener.subscribe(
            KEYS_CHANNEL, on_notice=lambda _payload: self.forget(), on_connect=self.forget
        )

    def forget(self) -> None:
        """The loaded keys may be out of date from now on: the next request reloads them."""
        self._generation += 1
        if self._loaded is not None:
            self._loaded = Loaded(self._loaded.live, self._loaded.ever, 0.0)

    @property
    def live_count(self) -> int:
        """How many stored keys the last load found live (for tests and logs)."""
        return len(self._loaded.live) if self._loaded is not None else 0

    async def enabled(self) -> bool:
        return await self._checked() is not None

    async def _checked(self) -> Loaded | bool | None:
        """None while auth is off; else True, or the keys loaded to tell (used for the token)."""
        if self._required or self._keys_exist:
            return True
        try:
            loaded = await self._keys()
        except errors.StoreUnavailable:
            # No key can be created while PostgreSQL is away: the last load's "none" keeps an
            # open node open (its /metrics and /readyz answer through the outage). Never loaded:
            # 503, neither open nor refused.
            if self._loaded is not None and not self._loaded.ever:
                return None
            raise
        return loaded if loaded.ever else None

    async def authenticate(self, token: str | None) -> api_keys.Principal:
        """The caller's Principal; Unauthenticated for a missing or unknown key (auth on)."""
        checked = await self._checked()
        if checked is None:
            return api_keys.OPEN_ACCESS
        if not token:
            raise errors.Unauthenticated()
        token_digest = api_keys.digest(token)
        principal = None
        # Every static key is compared, in constant time, whichever matches.
        for static in self._static:
            if hmac.compare_digest(static.digest, token_digest):
                principal = static.principal
        if principal is None:
            # One load per request at most: the one that told auth is on serves the token too.
            loaded = checked if isinstance(checked, Loaded) else await self._keys()
            # A dict lookup by hash: the hash of a random token says nothing about a real one's.
            principal = loaded.live.get(token_digest)
        if principal is None:
            raise errors.Unauthenticated("the API key is not valid (unknown or revoked)")
        return principal

    async def _keys(self) -> Loaded:
        """The stored keys, loaded again when past ``cache_s`` or after a notice;
        StoreUnavailable when they cannot be (never an out-of-date answer)."""
        loaded = self._loaded
        if loaded is not None and loaded.valid_until > self._mono():
            return loaded
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
            self._loading.add_done_callback(self._loaded_one)
            self._loading_since = self._mono()
        wait_s = max(0.0, self._loading_since + LOAD_WAIT_S - self._mono())
        try:
            return await asyncio.wait_for(asyncio.shield(self._loading), wait_s)
        except TimeoutError:
            raise errors.StoreUnavailable("the API keys could not be read in time") from None

    def _loaded_one(self, loading: asyncio.Future[Loaded]) -> None:
        self._loading = None
        if not loading.cancelled():
            loading.exception()  # retrieved: each waiter gets it; no "never retrieved" warning

    async def _load(self) -> Loaded:
        generation, until = self._generation, self._mono() + self._cache_s
        keys, ever = await self._store.live()
        if generation != self._generation:
            until = 0.0  # a notice came while it was read: good for the callers waiting, no more
        loaded = Loaded({digest: key.principal() for digest, key in keys.items()}, ever, until)
        self._loaded = loaded
        if ever:
            self._keys_exist = True
        return loaded
