"""Lateness as a user sees it, at the handler: jobs due at 1 000/s and 5 000/s for a fixed time,
submitted with the batch API, handled by an SDK consumer with its default settings and outcome
events on (its own process; lateness taken inside the handler). In the same run a raw receiver
(bench.receiver) reads every job too: the dispatcher's own lateness. And the CPU each process
spent per 1 000 jobs: the dispatcher, the consumer, PostgreSQL and RabbitMQ; and what each job
cost PostgreSQL's storage (``bench.storage``: WAL bytes, records and full-page images, row
versions per table and how many updates were HOT, the WAL's record types).

    .venv/bin/python -m bench.end_to_end [--seconds 60] [--rates 1000 5000] [--runs 3]
        [--results end_to_end]

``bench.compare`` runs it for two trees in turn and prints each figure's ratio.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench import harness, storage
from bench.cpu import tree_seconds
from bench.harness import Services, medians, services_with_node, started, stopped, summary, write
from bench.lateness import drained, rates_and_runs, received, steady
from devstack.dispatcher_process import DispatcherProcess

ROUTING_KEY = "bench.e2e"


def roots(svc: Services, node: DispatcherProcess, consumer: int) -> dict[str, list[int]]:
    postmaster = int((svc.postgres.data / "postmaster.pid").read_text().split()[0])
    beam = int((svc.rabbit.root / "rabbitmq.pid").read_text().split()[0])
    return {
        "dispatcher": [node.pid],
        "consumer": [consumer],
        "postgres": [postmaster],
        "rabbitmq": [beam],
    }


async def one_run(
    svc: Services, node: DispatcherProcess, folder: Path, rate: int, seconds: float, run: int
) -> dict[str, float]:
    at_handler = folder / f"handler-{rate}-{run}.txt"
    at_receiver = folder / f"receiver-{rate}-{run}.txt"
    consumer = started("bench.handler_consumer", svc.amqp_url, ROUTING_KEY, str(at_handler))
    receiver = started("bench.receiver", svc.amqp_url, ROUTING_KEY, str(at_receiver))
    try:
        processes = roots(svc, node, consumer.pid)
        stored_before = await storage.read(svc.database_url)
        before = {name: tree_seconds(pids) for name, pids in processes.items()}
        accepted = await steady(node.url, rate, seconds, routing_key=ROUTING_KEY)
        await drained(at_handler, len(accepted), deadline_s=180)
        await drained(at_receiver, len(accepted), deadline_s=60)
        await asyncio.sleep(2)  # the last outcome events reach the dispatcher
        spent = {name: tree_seconds(pids) - before[name] for name, pids in processes.items()}
        stored_after = await storage.read(svc.database_url)
    finally:
        stopped(consumer)
        stopped(receiver)
    stored = storage.cost(stored_before, stored_after, len(accepted), svc.postgres.data / "pg_wal")
    print("\n".join(f"        {line}" for line in stored.lines()), flush=True)
    handled = received(at_handler)  # lateness at the handler, the first per job
    got = received(at_receiver)
    stats = {f"handler_{k}": v for k, v in summary(list(handled.values())).items()}
    alone = [got[job_id] - run_at for job_id, run_at in accepted.items() if job_id in got]
    stats |= {f"dispatcher_{k}": v for k, v in summary(alone).items()}
    stats["not_handled"] = len(accepted) - len(handled.keys() & accepted.keys())
    stats |= {f"cpu_ms_per_1000_{name}": s * 1e6 / len(accepted) for name, s in spent.items()}
    stats |= stored.figures()
    return stats


async def main(seconds: float, rates: list[int], runs: int = 3, name: str = "end_to_end") -> None:
    results: dict[str, object] = {"seconds": seconds, "runs": runs, "machine": harness.machine()}
    with services_with_node() as (svc, folder, node):
        for rate in rates:
            each = [await one_run(svc, node, folder, rate, seconds, run) for run in range(runs)]
            stats = medians(each)
            results[f"rate_{rate}"] = {"median": stats, "runs": each}
            ms = {key: value * 1000 for key, value in stats.items()}
            print(
                f"  {rate:5}/s for {seconds:.0f}s (median of {runs}): at the handler p50"
                f" {ms['handler_p50']:.1f} p99 {ms['handler_p99']:.1f} max"
                f" {ms['handler_max']:.1f} ms; the dispatcher alone p50"
                f" {ms['dispatcher_p50']:.1f} p99 {ms['dispatcher_p99']:.1f} max"
                f" {ms['dispatcher_max']:.1f} ms; not handled {stats['not_handled']:.0f}",
                flush=True,
            )
            print(
                "        CPU ms per 1 000 jobs: "
                + ", ".join(
                    f"{name} {stats[f'cpu_ms_per_1000_{name}']:.0f}"
                    for name in ("dispatcher", "consumer", "postgres", "rabbitmq")
                )
                + f"; WAL {stats['wal_bytes_per_job']:.0f} bytes per job",
                flush=True,
            )
    print(f"  written to {write(name, results)}")


if __name__ == "__main__":
    args = rates_and_runs()
    harness.run(main(args.seconds, args.rates, args.runs, args.results or "end_to_end"))
