"""RabbitMQ policies that give queues declared by an earlier release what this one declares.

RabbitMQ refuses to redeclare a queue with new arguments, and settings that must change on
queues that exist belong in policies. ``dispatcher broker apply-policies`` writes them:

    dispatcher-events               dispatcher.events: delivery limit 50, then at-least-once
                                    dead-lettering to dispatcher.events.dead (declared here too)
    dispatcher-dead-letter-queues   (4.x) every queue ending in .dead: no delivery limit (4.x
                                    would drop a dead job handed back 20 times)

A queue follows one policy, the one of highest priority: a vhost with policies of its own gives
these a priority above them (``--priority``) and merges its keys into theirs by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumers_sdk import contract, management, topology
from consumers_sdk.errors import BrokerToolError


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    pattern: str
    definition: dict[str, object] = field(default_factory=dict)
    apply_to: str = "queues"
    priority: int = 0

    def body(self) -> dict[str, object]:
        return {
            "pattern": self.pattern,
            "definition": self.definition,
            "priority": self.priority,
            "apply-to": self.apply_to,
        }


def policies(major: int, *, priority: int = 0) -> list[Policy]:
    """The policies for a broker of this major version."""
    events = Policy(
        "dispatcher-events",
        f"^{contract.EVENTS_QUEUE.replace('.', '[.]')}$",
        {
            "delivery-limit": topology.POISON_DELIVERY_LIMIT,
            "dead-letter-exchange": "",
            "dead-letter-routing-key": topology.EVENTS_DEAD_QUEUE,
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
        },
        priority=priority,
    )
    if major < 4:  # 3.x sets no default limit, and reads -1 as "drop at the first return"
        return [events]
    dead = Policy(
        "dispatcher-dead-letter-queues", "[.]dead$", {"delivery-limit": -1}, priority=priority
    )
    return [events, dead]


async def apply(
    amqp_url: str, management_url: str, *, dry_run: bool = False, priority: int = 0
) -> tuple[str, list[Policy]]:
    """Write the policies into the AMQP URL's vhost (idempotent); returns the broker's version
    and the policies, written or, with ``dry_run``, only listed."""
    async with management.connect(management_url) as http:
        overview = (await management.request(http, "GET", "/api/overview")).json()
        version = str(overview.get("rabbitmq_version", ""))
        major = topology.major_of(version)
        if major is None:
            raise BrokerToolError(f"cannot tell RabbitMQ's version from {version!r}")
        wanted = policies(major, priority=priority)
        if dry_run:
            return version, wanted
        vhost = management.vhost_path(amqp_url)
        # The events' dead-letter target must exist before events are routed to it.
        await management.request(
            http,
            "PUT",
            f"/api/queues/{vhost}/{topology.EVENTS_DEAD_QUEUE}",
            json={"durable": True, "arguments": topology.dead_arguments("quorum", major)},
        )
        for policy in wanted:
            await management.request(
                http, "PUT", f"/api/policies/{vhost}/{policy.name}", json=policy.body()
            )
    return version, wanted
