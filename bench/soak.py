"""Load held: the whole system (PostgreSQL, RabbitMQ, one dispatcher, a receiver in its own
process) at a steady submission and firing rate for a fixed time. Every interval prints what was
submitted and delivered, the lateness of the jobs delivered in that interval and the
dispatcher's RSS; at the end: lost jobs (must be 0), duplicates, and whether RSS stayed flat once
the heap was full.

    .venv/bin/python -m bench.soak [--duration-s 600] [--rate 500] [--ahead-s 30] [--every-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench import harness
from bench.harness import percentile, services, write
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port

BATCH = 1000
# RSS counts as flat when, after the warm-up, it moves by less than this (or 10 %).
FLAT_MB = 8.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Tally:
    """What was accepted (id -> run_at) and what arrived (id -> arrival times)."""

    accepted: dict[str, float] = field(default_factory=dict)
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    _offset: int = 0

    def read_new(self, path: Path) -> list[float]:
        """Take the receiver's new complete lines; the lateness of first arrivals among them."""
        if not path.exists():
            return []
        with path.open("rb") as received:
            received.seek(self._offset)
            chunk = received.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        late = []
        for line in complete.decode().splitlines():
            job_id, at = line.split()
            times = self.arrivals.setdefault(job_id, [])
            times.append(float(at))
            if len(times) == 1 and job_id in self.accepted:
                late.append(float(at) - self.accepted[job_id])
        return late

    def lost(self) -> int:
        return sum(1 for job_id in self.accepted if job_id not in self.arrivals)

    def duplicates(self) -> int:
        return sum(len(times) - 1 for times in self.arrivals.values() if len(times) > 1)


async def submit_steadily(url: str, tally: Tally, rate: int, ahead_s: float, until: float) -> None:
    """Each second, ``rate`` jobs due evenly over one second, ``ahead_s`` from now."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        second = time.time()
        while second < until:
            await asyncio.sleep(max(0.0, second - time.time()))
            due = second + ahead_s
            for first in range(0, rate, BATCH):
                jobs = [
                    {
                        "routing_key": "bench.soak",
                        "payload": {"n": i},
                        "run_at": datetime.fromtimestamp(due + i / rate, UTC).isoformat(),
                    }
                    for i in range(first, min(first + BATCH, rate))
                ]
                response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
                response.raise_for_status()
                for job in response.json()["jobs"]:
                    tally.accepted[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
            second += 1.0


def row(elapsed: float, tally: Tally, late: list[float], rss: float) -> dict[str, float]:
    return {
        "elapsed_s": round(elapsed, 1),
        "submitted": len(tally.accepted),
        "delivered": len(tally.arrivals),
        "interval_delivered": len(late),
        "p50_ms": percentile(late, 0.50) * 1000,
        "p99_ms": percentile(late, 0.99) * 1000,
        "max_ms": max(late, default=float("nan")) * 1000,
        "rss_mb": round(rss, 1),
    }


def show(values: dict[str, float]) -> None:
    print(
        f"  {values['elapsed_s']:7.0f}s  submitted {values['submitted']:8.0f}  "
        f"delivered {values['delivered']:8.0f}  lateness p50 {values['p50_ms']:7.1f} ms  "
        f"p99 {values['p99_ms']:8.1f} ms  max {values['max_ms']:8.1f} ms  "
        f"rss {values['rss_mb']:6.1f} MB",
        flush=True,
    )


async def main(duration_s: float, rate: int, ahead_s: float, every_s: float) -> int:
    tally = Tally()
    rows: list[dict[str, float]] = []
    with services() as svc, tempfile.TemporaryDirectory() as folder:
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        node = DispatcherProcess(Path(folder), port=reserve_port(), env=env)
        node.start()
        output = Path(folder) / "received.txt"
        receiver = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
            [sys.executable, "-m", "bench.receiver", svc.amqp_url, "bench.soak", str(output)],
            stdout=subprocess.PIPE,
        )
        try:
            assert receiver.stdout is not None
            receiver.stdout.readline()  # "ready"
            started = time.time()
            submitter = asyncio.create_task(
                submit_steadily(node.url, tally, rate, ahead_s, started + duration_s)
            )
            # Run past the last submission until its jobs are due and have had time to arrive.
            end = started + duration_s + ahead_s + 30
            while time.time() < end and (not submitter.done() or tally.lost()):
                await asyncio.sleep(every_s)
                late = await asyncio.to_thread(tally.read_new, output)
                rows.append(row(time.time() - started, tally, late, rss_mb(node.pid)))
                show(rows[-1])
            await submitter
        finally:
            receiver.terminate()
            receiver.wait(30)
            node.stop()
        await asyncio.to_thread(tally.read_new, output)  # the receiver's last flush
    warm = [r["rss_mb"] for r in rows if ahead_s + every_s <= r["elapsed_s"] <= duration_s]
    spread = max(warm) - min(warm) if warm else float("nan")
    flat = bool(warm) and spread <= max(FLAT_MB, 0.1 * min(warm))
    summary = {
        "duration_s": duration_s,
        "rate": rate,
        "ahead_s": ahead_s,
        "accepted": len(tally.accepted),
        "lost": tally.lost(),
        "duplicates": tally.duplicates(),
        "rss_after_warmup_min_mb": min(warm, default=float("nan")),
        "rss_after_warmup_max_mb": max(warm, default=float("nan")),
        "rss_flat": flat,
    }
    print(
        f"  accepted {summary['accepted']}, lost {summary['lost']}, duplicates "
        f"{summary['duplicates']}; RSS after the {ahead_s + every_s:.0f}s warm-up "
        f"{summary['rss_after_warmup_min_mb']:.1f}-{summary['rss_after_warmup_max_mb']:.1f} MB "
        f"({'flat' if flat else 'NOT flat'})"
    )
    print(f"  written to {write('soak', {**summary, 'rows': rows})}")
    return 0 if summary["lost"] == 0 and flat else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--rate", type=int, default=500, help="jobs submitted (and due) per second")
    parser.add_argument("--ahead-s", type=float, default=30, help="how far ahead each job is due")
    parser.add_argument("--every-s", type=float, default=10, help="seconds between rows")
    args = parser.parse_args()
    print(
        f"soak: {args.rate} jobs/s for {args.duration_s:.0f}s, each due {args.ahead_s:.0f}s "
        "after it is submitted"
    )
    sys.exit(harness.run(main(args.duration_s, args.rate, args.ahead_s, args.every_s)))
