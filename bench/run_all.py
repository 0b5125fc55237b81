"""`make bench`: every benchmark in turn, each printing its table and writing bench/results/."""

import asyncio

from bench import failover, throughput

if __name__ == "__main__":
    asyncio.run(throughput.main(runs=3, jobs=30000))
    asyncio.run(failover.main(kills=3, rate=200, session_s=5.0))
