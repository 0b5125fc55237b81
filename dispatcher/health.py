"""What this node can do now, and whether it should hand its shards to others (gray failures).

A node can be alive and in ZooKeeper, yet unable to do its work: cut from PostgreSQL (it cannot
claim), from RabbitMQ (nothing it publishes is confirmed), or on a clock it cannot trust. Each
service's state comes from probes (the clock sample every second reads PostgreSQL; a round trip
on the publisher's channel reads RabbitMQ) and from firing itself (claims, confirms): the last
word counts, and a failure dates from when the failing attempt began.

From those, the node's standing, with hysteresis:

    OK          nothing failing
    FAILING     a service failing for less than the step-out bound: the node keeps its shards
    OUT         failing past the bound: the node asks for its shards to go to the others
    RECOVERING  well again after its shards went: it waits before taking any back, twice as long
                after each step-out of the last ten minutes (a node that flaps stays out longer)

A node that stepped out but kept its shards (no other node was well enough to take them: the
service is down for everyone) is OK again as soon as it is well.

Pure: no I/O; the caller passes the monotonic time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum

# Step-outs this recent lengthen the wait before rejoining: two in the window double it, three
# quadruple it, up to MAX_BACKOFF times.
FLAP_WINDOW_S = 600.0
MAX_BACKOFF = 8


class Service(StrEnum):
    POSTGRES = "postgres"
    RABBITMQ = "rabbitmq"
    CLOCK = "clock"


class Standing(StrEnum):
    OK = "ok"
    FAILING = "failing"
    OUT = "out"
    RECOVERING = "recovering"


@dataclass(slots=True)
class _State:
    failing_since: float | None = None
    reason: str = ""
    last_ok: float | None = None
    slow_since: float | None = None  # a probe is taking long: not failed (yet)


class Health:
    def __init__(self, *, step_out_s: float, rejoin_s: float) -> None:
        self.step_out_s = step_out_s
        self.rejoin_s = rejoin_s
        self._services = {service: _State() for service in Service}
        self.standing = Standing.OK
        self._since = 0.0  # when the standing was entered
        self._outs: deque[float] = deque()  # when the node stepped out, within FLAP_WINDOW_S

    # --- what the probes and firing saw -------------------------------------------------------

    def ok(self, service: Service, now: float) -> None:
        state = self._services[service]
        state.failing_since = state.slow_since = None
        state.reason = ""
        state.last_ok = now

    def failed(self, service: Service, reason: str, since: float) -> None:
        """SERVICE failed an attempt begun at SINCE (a failure that took a timeout to show dates
        from the attempt, not from the timeout)."""
        state = self._services[service]
        if state.failing_since is None or since < state.failing_since:
            state.failing_since = since
        state.reason = reason

    def slow(self, service: Service, since: float) -> None:
        """A probe of SERVICE begun at SINCE has not answered yet. Not a failure (readiness is
        not touched, nothing steps out on it), but the node is FAILING meanwhile: the cluster
        hears of a failure every node shares (the service itself down) long before anybody
        steps out, so nobody's shards go to a node that cannot take them either."""
        state = self._services[service]
        if state.slow_since is None:
            state.slow_since = since

    def failing(self, now: float) -> dict[Service, tuple[float, str]]:
        """The failing services: for how long, and the last reason."""
        return {
            service: (max(0.0, now - state.failing_since), state.reason)
            for service, state in self._services.items()
            if state.failing_since is not None
        }

    # --- the standing -------------------------------------------------------------------------

    def judge(self, now: float, *, holds_shards: bool) -> Standing:
        """Move the standing on, from what is failing now; HOLDS_SHARDS: whether the node still
        owns any (a node that stepped out but kept them needs no wait to be OK again)."""
        failing = self.failing(now)
        worst = max((seconds for seconds, _ in failing.values()), default=None)
        slow = any(state.slow_since is not None for state in self._services.values())
        match self.standing:
            case Standing.OK if worst is not None or slow:
                self._enter(Standing.FAILING, now)
                return self.judge(now, holds_shards=holds_shards)
            case Standing.FAILING if worst is None and not slow:
                self._enter(Standing.OK, now)
            case Standing.FAILING if worst is not None and worst >= self.step_out_s:
                self._outs.append(now)
                self._enter(Standing.OUT, now)
            case Standing.OUT if worst is None:
                self._enter(Standing.OK if holds_shards else Standing.RECOVERING, now)
            case Standing.RECOVERING if worst is not None:
                self._enter(Standing.OUT, now)
            case Standing.RECOVERING if now - self._since >= self.rejoin_wait_s(now):
                self._enter(Standing.OK, now)
        return self.standing

    def rejoin_wait_s(self, now: float) -> float:
        """How long a node well again waits before it takes shards back: ``rejoin_s``, doubled
        for each further step-out within ``FLAP_WINDOW_S``."""
        while self._outs and now - self._outs[0] > FLAP_WINDOW_S:
            self._outs.popleft()
        recent = max(1, len(self._outs))
        return self.rejoin_s * min(1 << (recent - 1), MAX_BACKOFF)

    def describe(self, now: float) -> dict[str, object]:
        """For ``/readyz``: the standing, since when, the failing services and why, and how long
        ago each service last answered."""
        answer: dict[str, object] = {
            "standing": self.standing.value,
            "for_s": round(now - self._since, 3),
            "step_out_s": self.step_out_s,
            "failing": {
                service.value: {"for_s": round(seconds, 3), "reason": reason}
                for service, (seconds, reason) in self.failing(now).items()
            },
            "last_ok_s_ago": {
                service.value: None if state.last_ok is None else round(now - state.last_ok, 3)
                for service, state in self._services.items()
            },
        }
        if self.standing is Standing.RECOVERING:
            answer["rejoin_in_s"] = round(max(0.0, self._since + self.rejoin_wait_s(now) - now), 3)
        return answer

    def reason(self, now: float) -> str | None:
        """Why the node is not OK, in a sentence, or None."""
        if self.standing is Standing.OK:
            return None
        failing = self.failing(now)
        causes = "; ".join(
            f"{service.value} failing for {seconds:.1f} s: {reason}"
            for service, (seconds, reason) in sorted(failing.items())
        )
        slow = [
            service.value
            for service, state in sorted(self._services.items())
            if state.slow_since is not None and service not in failing
        ]
        if slow:
            causes = "; ".join(filter(None, [causes, f"{', '.join(slow)} slow to answer"]))
        match self.standing:
            case Standing.FAILING:
                return f"{causes} (its shards go to the others after {self.step_out_s:g} s)"
            case Standing.OUT:
                return f"stepped out: its shards go to any node well enough to fire: {causes}"
            case _:
                wait = max(0.0, self._since + self.rejoin_wait_s(now) - now)
                return f"well again after stepping out: takes shards back in {wait:.1f} s"

    def _enter(self, standing: Standing, now: float) -> None:
        self.standing = standing
        self._since = now
