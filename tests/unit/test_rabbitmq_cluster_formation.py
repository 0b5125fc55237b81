"""How a devstack RabbitMQ cluster forms as its nodes boot (``rabbitmq_cluster.formation``): 3.x
nodes join the seed, which names no one; 4.x nodes all name all and wait for the whole cluster.
The clusters the fault tests start (both releases) show that the nodes do join."""

from pathlib import Path

from devstack import rabbitmq4
from devstack.rabbitmq import RabbitServer
from devstack.rabbitmq_cluster import formation


def settings(lines: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in lines.splitlines())


def nodes3() -> list[RabbitServer]:
    return [RabbitServer(Path(f"/n{n}"), 1, 2, 3, f"n{n}@localhost") for n in (1, 2, 3)]


def nodes4() -> list[RabbitServer]:
    chroot = Path("/chroot")
    return [
        rabbitmq4.Rabbit4Server(chroot, chroot / f"n{n}", 1, 2, 3, f"n{n}@localhost")
        for n in (1, 2, 3)
    ]


def test_a_3x_seed_names_no_peer_and_the_others_name_the_seed_alone() -> None:
    seed, *others = nodes3()
    assert formation(seed, seed, [seed, *others]) == ""
    for node in others:
        named = settings(formation(node, seed, [seed, *others]))
        assert named["cluster_formation.peer_discovery_backend"] == "classic_config"
        assert named["cluster_formation.classic_config.nodes.1"] == "n1@localhost"
        assert "cluster_formation.classic_config.nodes.2" not in named
        assert "cluster_formation.target_cluster_size_hint" not in named  # 3.10 knows no such key


def test_every_4x_node_names_all_three_and_waits_for_three() -> None:
    members = nodes4()
    for node in members:
        named = settings(formation(node, members[0], members))
        assert [named[f"cluster_formation.classic_config.nodes.{n}"] for n in (1, 2, 3)] == [
            "n1@localhost",
            "n2@localhost",
            "n3@localhost",
        ]
        assert named["cluster_formation.target_cluster_size_hint"] == "3"


def test_a_node_keeps_asking_for_as_long_as_a_cluster_may_take_to_form() -> None:
    seed, node, _ = nodes3()
    named = settings(formation(node, seed, [seed, node]))
    retries = int(named["cluster_formation.discovery_retry_limit"])
    interval_ms = int(named["cluster_formation.discovery_retry_interval"])
    assert retries * interval_ms >= 120_000
