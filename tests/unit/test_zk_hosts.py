"""DISPATCHER_ZK_HOSTS names every server of an ensemble and, once at the end, a chroot: the
servers go to the client as they are, the chroot prefixes the cluster's own paths."""

from dispatcher.cluster.zk import split_hosts

ENSEMBLE = "10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2182"


def test_every_server_of_an_ensemble_reaches_the_client_and_the_chroot_prefixes_the_path() -> None:
    assert split_hosts(f"{ENSEMBLE}/prod", "/dispatcher") == (ENSEMBLE, "/prod/dispatcher")


def test_an_ensemble_without_a_chroot_keeps_the_cluster_path() -> None:
    assert split_hosts(ENSEMBLE, "dispatcher/") == (ENSEMBLE, "/dispatcher")
