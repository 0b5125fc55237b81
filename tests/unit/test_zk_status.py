"""Status znode names, ``<standing>.<node>``, read back as each node's standing."""

from dispatcher.cluster.zk import standings


def test_each_status_names_its_node_and_standing() -> None:
    assert standings(["out.n1", "failing.node.with.dots"]) == {
        "n1": "out",
        "node.with.dots": "failing",
    }


def test_a_name_without_a_standing_is_ignored() -> None:
    assert standings(["stray"]) == {}
