"""What ``/readyz`` says of a node: one check per thing it needs, and its standing with when
firing last claimed and had a publish confirmed. Read across the subsystems, owned by none."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dispatcher.health import Service, Standing
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.firing import Firing
from dispatcher.node.messaging import Messaging
from dispatcher.node.upkeep import Upkeep


@dataclass(frozen=True, slots=True)
class Status:
    core: Core
    messaging: Messaging
    coordination: Coordination
    firing: Firing
    upkeep: Upkeep

    async def readiness(self) -> dict[str, bool]:
        steward, ownership = self.upkeep.steward, self.coordination.ownership
        return {
            "postgres": steward.answering(Service.POSTGRES),
            "rabbitmq": self.messaging.publisher.is_ready()
            and self.messaging.live_publisher.is_ready()
            and steward.answering(Service.RABBITMQ),
            "zookeeper": ownership.coordinated(),
            "shards": bool(ownership.epochs()),
            "clock": self.core.timekeeper.trusted(),
            # Stepped out (or waiting to rejoin); a service failing shows in its own check.
            "standing": steward.standing() in (Standing.OK, Standing.FAILING),
            "loops": not self.core.supervisor.degraded(),
        }

    def standing(self) -> dict[str, object]:
        """The node's standing, and when firing last claimed and had a publish confirmed."""
        now = time.monotonic()
        steward, firer = self.upkeep.steward, self.firing.firer
        answer = steward.describe()
        for name, at in (("claim", firer.claimed_at), ("confirm", firer.confirmed_at)):
            answer[f"last_{name}_s_ago"] = None if at is None else round(now - at, 3)
        reason = steward.reason()
        if reason is not None:
            answer["reason"] = reason
        return answer
