"""`make bench`: every benchmark in turn, each printing its table and writing bench/results/."""

import argparse

from bench import (
    backlog,
    bulk_reads,
    bulk_requeue,
    compare,
    consumer_throughput,
    end_to_end,
    failover,
    fairness,
    flow_rules,
    ha_failover,
    harness,
    held_snapshot,
    insert_paths,
    lateness,
    list_queries,
    many_rules,
    metered_rate,
    single_submit,
    throughput,
    versus_celery,
    zk_ensemble,
)

if __name__ == "__main__":
    harness.run(throughput.main(runs=3, jobs=30000, fire_jobs=100_000))
    harness.run(lateness.main(seconds=60, rates=[1000, 5000], runs=3))
    harness.run(end_to_end.main(seconds=60, rates=[1000, 5000], runs=3))
    harness.run(consumer_throughput.main(jobs=100_000, runs=3))
    harness.run(single_submit.main(seconds=10, runs=3))
    harness.run(insert_paths.main(runs=3, count=10, single=1000))
    harness.run(backlog.main(rows=[1_000_000, 10_000_000], overdue=200_000, runs=3))
    harness.run(failover.main(kills=3, rate=200, session_s=5.0))
    harness.run(zk_ensemble.main(rounds=2, rate=200, session_s=6.0))
    harness.run(ha_failover.main(rate=200, session_s=6.0))
    harness.run(fairness.main(burst=100_000, overdue=20_000, rate=1000, runs=3))
    harness.run(versus_celery.main(count=20000, runs=3))
    harness.run(list_queries.main(rows=1_000_000, calls=50, runs=3))
    harness.run(
        flow_rules.main(
            jobs=50_000, rules=1000, metered=100, rate=1000, seconds=60, held=1_000_000, runs=3
        )
    )
    harness.run(many_rules.main(rules=10_000, metered=5_000, changes=5, steady_s=35.0))
    harness.run(metered_rate.main(metered_rate.Args()))
    harness.run(held_snapshot.main(minutes=30, rate=800, explain_at=[1, 10], held=True))
    harness.run(
        bulk_requeue.main(
            dead=100_000, rate=1000, seconds=45, runs=2, duty=0.5, bulk_rate=5000, batch=100
        )
    )
    harness.run(
        bulk_reads.main(
            argparse.Namespace(jobs=1_000_000, clients=64, seconds=60.0, rate=500, runs=3)
        )
    )
    # Last: the end-to-end figures against the commit before, in this sitting (ratios).
    compare.compare("HEAD~1", seconds=20, rates=(1000, 3000))
