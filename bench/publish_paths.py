"""Firing on each publish path in one run: batches framed as one write, and aiormq's public
publish a message at a time (the fallback on an untested aiormq; ``DISPATCHER_PUBLISH_PATH``).

    .venv/bin/python -m bench.publish_paths [--fire-jobs 50000] [--messages 20000]

Per path: the publisher alone, no database (4 batches of 500 in flight), then a dispatcher on
that path firing N jobs due at one instant (due -> confirmed in the queue, as ``bench.throughput``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import get_args

from bench import harness, throughput
from bench.harness import services, write
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.amqp.publisher import PublishPath
from dispatcher.store.migrate import apply_migrations

PATHS = [path for path in get_args(PublishPath) if path != "auto"]


async def main(fire_jobs: int, messages: int) -> None:
    result: dict[str, dict[str, float]] = {}
    with services() as svc, tempfile.TemporaryDirectory() as logs:
        await apply_migrations(svc.database_url)
        for path in PATHS:
            alone = await throughput.ceiling_publish_framed(svc.amqp_url, messages, path)
            env = {
                "DISPATCHER_DATABASE_URL": svc.database_url,
                "DISPATCHER_AMQP_URL": svc.amqp_url,
                "DISPATCHER_PUBLISH_PATH": path,
            }
            # One node at a time: two single-node dispatchers on one database fence each other.
            node = DispatcherProcess(Path(logs), port=reserve_port(), env=env, name=path)
            node.start()
            try:
                rate, last = await throughput.fire(node.url, svc.amqp_url, fire_jobs)
            finally:
                node.stop()
            result[path] = {"publisher_alone_msg_s": alone, "fire_jobs_s": rate, "last_s": last}
    print(f"publish paths: {fire_jobs} jobs due at once, {messages} publisher-only messages")
    for path, m in result.items():
        print(
            f"  {path:12} fire {m['fire_jobs_s']:7.0f} jobs/s (last {m['last_s']:.2f}s after due);"
            f" publisher alone {m['publisher_alone_msg_s']:7.0f} msg/s"
        )
    print(f"  written to {write('publish_paths', {'paths': result, 'fire_jobs': fire_jobs})}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fire-jobs", type=int, default=50_000)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    harness.run(main(args.fire_jobs, args.messages))
