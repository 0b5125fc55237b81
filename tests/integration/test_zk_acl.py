"""ZooKeeper ACLs (DISPATCHER_ZK_AUTH) on the real ZooKeeper: nodes with the same credentials
share their tree, every znode they make is closed to anyone else, wrong credentials stop a node
with ZkAccessDenied (a process exits with a clear message), and a tree made before auth was set
is closed at the next start."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, make_digest_acl

from dispatcher import errors
from dispatcher.cluster.zk import split_hosts
from tests.integration.test_zk_ownership import SHARDS, member, owned_exactly_once
from tests.support.waiting import eventually

AUTH = "dispatcher:s3cret-zk-password"
WRONG = "dispatcher:not-the-password"
OURS = [make_digest_acl("dispatcher", "s3cret-zk-password", all=True)]


@contextmanager
def kazoo(zk_hosts: str, auth: str = "") -> Iterator[KazooClient]:
    """A client of the test's own, authenticated when ``auth`` is given."""
    servers = zk_hosts.partition("/")[0]
    client = KazooClient(hosts=servers, auth_data=[("digest", auth)] if auth else None, timeout=5)
    client.start(15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def base(zk_hosts: str) -> str:
    return split_hosts(zk_hosts, "/dispatcher")[1]


def acls_of_tree(client: KazooClient, root: str) -> dict[str, list[ACL]]:
    """Every znode under ``root`` (itself included) and its ACL."""
    found: dict[str, list[ACL]] = {}
    pending = [root]
    while pending:
        path = pending.pop()
        found[path] = list(client.get_acls(path)[0])
        pending.extend(f"{path}/{child}" for child in client.get_children(path))
    return found


def refused_to_strangers(zk_hosts: str) -> None:
    """An unauthenticated client can neither read nor change nor add anything."""
    root = base(zk_hosts)
    with kazoo(zk_hosts) as stranger:
        attempts = {
            "read meta": lambda: stranger.get(f"{root}/meta"),
            "list members": lambda: stranger.get_children(f"{root}/members"),
            "read the assignment": lambda: stranger.get(f"{root}/assignment"),
            "write meta": lambda: stranger.set(f"{root}/meta", b'{"shard_count": 1}'),
            "add a member": lambda: stranger.create(f"{root}/members/intruder", ephemeral=True),
            "delete meta": lambda: stranger.delete(f"{root}/meta"),
        }
        for what, attempt in attempts.items():
            try:
                attempt()
            except NoAuthError:
                continue
            pytest.fail(f"a stranger could {what}")


async def test_nodes_with_the_same_auth_share_a_tree_closed_to_anyone_else(
    zk_hosts: str, database_url: str
) -> None:
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(member(f"n{i}", zk_hosts, database_url, zk_auth=AUTH))
            for i in range(2)
        ]

        def split_evenly() -> bool:  # not just owned once: the second member may not have joined
            return (
                owned_exactly_once(nodes)
                and sorted(len(n.epochs()) for n in nodes) == [SHARDS // 2] * 2
            )

        await eventually(split_evenly, 30)
        await asyncio.to_thread(refused_to_strangers, zk_hosts)
        with kazoo(zk_hosts, AUTH) as insider:
            tree = await asyncio.to_thread(acls_of_tree, insider, base(zk_hosts))
    assert {
        f"{base(zk_hosts)}/{name}" for name in ("meta", "members", "election", "assignment")
    } < set(tree)
    assert len(tree) >= 8  # the folders, two members and two election znodes
    assert {path: OURS for path in tree} == tree


async def test_wrong_or_missing_credentials_stop_a_node_with_zk_access_denied(
    zk_hosts: str, database_url: str
) -> None:
    async with member("n0", zk_hosts, database_url, zk_auth=AUTH):
        for auth in (WRONG, ""):
            with pytest.raises(errors.ZkAccessDenied) as denied:
                async with member("n1", zk_hosts, database_url, zk_auth=auth):
                    pass
            assert isinstance(denied.value, errors.Fatal)
            assert "DISPATCHER_ZK_AUTH" in str(denied.value)


async def test_a_process_with_wrong_credentials_exits_with_a_clear_message(
    zk_hosts: str, database_url: str, amqp_url: str
) -> None:
    async with member("n0", zk_hosts, database_url, zk_auth=AUTH):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatcher",
            "serve",
            env={
                **os.environ,
                "DISPATCHER_DATABASE_URL": database_url,
                "DISPATCHER_AMQP_URL": amqp_url,
                "DISPATCHER_ZK_HOSTS": zk_hosts,
                "DISPATCHER_ZK_AUTH": WRONG,
                "DISPATCHER_SHARD_COUNT": str(SHARDS),
                "DISPATCHER_NODE_ID": "n1",
                "DISPATCHER_HTTP_PORT": "0",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), 60)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    output = out.decode()
    assert process.returncode == 1, output
    assert "dispatcher: ZooKeeper refused access to" in output
    assert "not-the-password" not in output
    assert "restarting" not in output


async def test_an_open_tree_made_before_auth_gets_the_acl_at_the_next_start(
    zk_hosts: str, database_url: str
) -> None:
    async with member("n0", zk_hosts, database_url) as open_node:
        await eventually(lambda: owned_exactly_once([open_node]), 20)
    with kazoo(zk_hosts) as stranger:  # open to anyone so far
        assert stranger.get(f"{base(zk_hosts)}/meta")[0]
    async with member("n0", zk_hosts, database_url, zk_auth=AUTH) as node:
        await eventually(lambda: owned_exactly_once([node]), 20)
        await asyncio.to_thread(refused_to_strangers, zk_hosts)
        with kazoo(zk_hosts, AUTH) as insider:
            tree = await asyncio.to_thread(acls_of_tree, insider, base(zk_hosts))
    assert f"{base(zk_hosts)}/assignment" in tree  # written before auth, closed since
    assert {path: OURS for path in tree} == tree
