"""The working tree against an earlier commit in one sitting: ``bench.end_to_end`` for each in
turn, BASE HEAD HEAD BASE (then again, for more rounds), so that drift over the sitting falls
on both alike; then each figure's median for each and their ratio, HEAD over BASE.

    .venv/bin/python -m bench.compare [--base REV] [--seconds 20] [--rates 1000 3000] [--rounds 1]

The earlier commit is checked out in a temporary git worktree. Its dispatcher, SDK and
migrations run (first on PYTHONPATH, as the node it starts inherits), measured by this tree's
benchmark and devstack, so both are measured the same way. Speed on a shared machine drifts
(up to 45% within an hour here): only ratios from one sitting mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.harness import RESULTS, write

ROOT = Path(__file__).resolve().parents[1]
# What runs of the measured tree; the rest (bench, devstack) is this tree's.
MEASURED = ("dispatcher", "consumers_sdk", "sql")
# The figures the table shows, in its order (every figure is in the results file).
SHOWN = (
    "handler_p50",
    "handler_p99",
    "dispatcher_p99",
    "cpu_ms_per_1000_dispatcher",
    "cpu_ms_per_1000_consumer",
    "cpu_ms_per_1000_postgres",
    "cpu_ms_per_1000_rabbitmq",
    "cpu_ms_per_1000_all",
    "wal_bytes_per_job",
    "wal_records_per_job",
    "wal_fpi_per_job",
    "jobs_ins_per_job",
    "jobs_upd_per_job",
    "jobs_hot_upd_per_job",
    "jobs_del_per_job",
    "job_events_ins_per_job",
    "event_batches_ins_per_job",
)


@contextmanager
def base_tree(rev: str) -> Iterator[Path]:
    """A folder to put first on PYTHONPATH: REV's measured packages beside this tree's rest."""
    with tempfile.TemporaryDirectory(prefix="dispatcher-compare-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev],
            check=True,
        )
        try:
            path = Path(scratch) / "path"
            path.mkdir()
            for name in MEASURED:
                (path / name).symlink_to(tree / name)
            for name in ("bench", "devstack"):
                (path / name).symlink_to(ROOT / name)
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
            )


def imported_from(path: Path) -> str:
    """Where ``dispatcher`` is imported from with PATH first on PYTHONPATH."""
    found = subprocess.run(
        [sys.executable, "-c", "import dispatcher; print(dispatcher.__file__)"],
        env={**os.environ, "PYTHONPATH": str(path)},
        cwd=path,
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.strip()


def one_run(path: Path, label: str, run: int, args: argparse.Namespace) -> dict[str, object]:
    name = f"compare-{label}-{run}"
    print(f"--- {label} (run {run + 1}), from {imported_from(path)}", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.end_to_end",
            "--seconds",
            str(args.seconds),
            "--rates",
            *map(str, args.rates),
            "--runs",
            "1",
            "--results",
            name,
        ],
        env={**os.environ, "PYTHONPATH": str(path)},
        cwd=path,
        check=True,
    )
    result: dict[str, object] = json.loads((RESULTS / f"{name}.json").read_text())
    (RESULTS / f"{name}.json").unlink()
    return result


def figures(result: dict[str, object], rate: int) -> dict[str, float]:
    at_rate = result[f"rate_{rate}"]
    assert isinstance(at_rate, dict)
    found = {str(k): float(v) for k, v in at_rate["median"].items()}
    found["cpu_ms_per_1000_all"] = sum(v for k, v in found.items() if k.startswith("cpu_ms"))
    return found


def ratios(
    base: list[dict[str, object]], head: list[dict[str, object]], rate: int
) -> dict[str, dict[str, float]]:
    """Each figure: BASE's median, HEAD's median and HEAD / BASE."""
    table = {}
    base_runs = [figures(result, rate) for result in base]
    head_runs = [figures(result, rate) for result in head]
    for key in base_runs[0].keys() | head_runs[0].keys():
        # A table one side has and the other has not (a storage change): 0 rows a job there.
        was = statistics.median(run.get(key, 0.0) for run in base_runs)
        now = statistics.median(run.get(key, 0.0) for run in head_runs)
        table[key] = {"base": was, "head": now, "ratio": now / was if was else float("nan")}
    return table


def show(table: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for key in SHOWN:
        if key in table:
            row = table[key]
            scale = 1000.0 if key.endswith(("_p50", "_p99")) else 1.0  # seconds shown as ms
            ratio = "-" if row["ratio"] != row["ratio"] else f"{row['ratio']:.2f}x"  # nan: 0 / 0
            lines.append(
                f"    {key:30} {row['base'] * scale:10.2f} {row['head'] * scale:10.2f} {ratio:>7}"
            )
    return lines


def compare(
    base_rev: str = "HEAD~1",
    seconds: float = 20,
    rates: Sequence[int] = (1000, 3000),
    rounds: int = 1,
) -> None:
    """Run both trees in turn and print the table (``make bench`` ends with this)."""
    args = argparse.Namespace(base=base_rev, seconds=seconds, rates=list(rates), rounds=rounds)
    base: list[dict[str, object]] = []
    head: list[dict[str, object]] = []
    with base_tree(args.base) as base_path:
        for round_ in range(args.rounds):
            base.append(one_run(base_path, "base", 2 * round_, args))
            head.append(one_run(ROOT, "head", 2 * round_, args))
            head.append(one_run(ROOT, "head", 2 * round_ + 1, args))
            base.append(one_run(base_path, "base", 2 * round_ + 1, args))
    results: dict[str, object] = {"base": args.base, "seconds": args.seconds}
    print(f"\nthe working tree against {args.base}: medians of {len(base)} runs each")
    for rate in args.rates:
        table = ratios(base, head, rate)
        results[f"rate_{rate}"] = table
        print(f"  {rate}/s for {args.seconds:.0f} s (ms, ms per 1 000 jobs, per job)")
        print(f"    {'':30} {'base':>10} {'head':>10} {'ratio':>7}")
        print("\n".join(show(table)))
    print(f"  written to {write('compare', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--rounds", type=int, default=1, help="each: BASE HEAD HEAD BASE")
    args = parser.parse_args()
    compare(args.base, args.seconds, args.rates, args.rounds)
