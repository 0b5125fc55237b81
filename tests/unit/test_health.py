"""The node's standing from what its probes saw (``dispatcher.health``): when it steps out, when
it comes back, and how much longer a node that keeps stepping out waits."""

import pytest

from dispatcher.health import FLAP_WINDOW_S, MAX_BACKOFF, Health, Service, Standing

BOUND = 10.0
REJOIN = 10.0


def health() -> Health:
    return Health(step_out_s=BOUND, rejoin_s=REJOIN)


def test_a_well_node_is_ok() -> None:
    node = health()
    node.ok(Service.POSTGRES, 1.0)
    assert node.judge(1.0, holds_shards=True) is Standing.OK
    assert node.reason(1.0) is None
    assert node.describe(1.0)["failing"] == {}


def test_a_failure_under_the_bound_keeps_the_shards_and_says_so() -> None:
    node = health()
    node.failed(Service.POSTGRES, "timeout", since=0.0)
    assert node.judge(BOUND - 0.1, holds_shards=True) is Standing.FAILING
    assert "postgres failing for 9.9 s: timeout" in str(node.reason(BOUND - 0.1))
    node.ok(Service.POSTGRES, BOUND - 0.05)
    assert node.judge(BOUND, holds_shards=True) is Standing.OK


def test_past_the_bound_it_steps_out_counting_from_when_the_failing_attempt_began() -> None:
    node = health()
    node.failed(Service.RABBITMQ, "no answer within 2 s", since=3.0)  # reported at 5.0
    assert node.judge(5.0, holds_shards=True) is Standing.FAILING
    assert node.judge(3.0 + BOUND - 0.01, holds_shards=True) is Standing.FAILING
    assert node.judge(3.0 + BOUND, holds_shards=True) is Standing.OUT
    assert node.describe(3.0 + BOUND)["failing"] == {
        "rabbitmq": {"for_s": BOUND, "reason": "no answer within 2 s"}
    }


def test_a_later_failure_does_not_restart_the_count_but_an_answer_does() -> None:
    node = health()
    node.failed(Service.POSTGRES, "first", since=0.0)
    node.failed(Service.POSTGRES, "second", since=4.0)
    assert node.failing(5.0) == {Service.POSTGRES: (5.0, "second")}
    node.ok(Service.POSTGRES, 6.0)
    node.failed(Service.POSTGRES, "third", since=7.0)
    assert node.failing(8.0) == {Service.POSTGRES: (1.0, "third")}


def stepped_out(node: Health, at: float) -> float:
    """Fail a service from AT until the node is out; the time it stepped out."""
    node.failed(Service.POSTGRES, "cut", since=at)
    node.judge(at, holds_shards=True)
    assert node.judge(at + BOUND, holds_shards=True) is Standing.OUT
    return at + BOUND


def test_well_again_with_its_shards_still_held_it_is_ok_at_once() -> None:
    # Nobody took them (the service was down for every node): no wait.
    node = health()
    out_at = stepped_out(node, 0.0)
    node.ok(Service.POSTGRES, out_at + 1)
    assert node.judge(out_at + 1, holds_shards=True) is Standing.OK


def test_well_again_after_its_shards_went_it_waits_before_taking_any_back() -> None:
    node = health()
    out_at = stepped_out(node, 0.0)
    node.ok(Service.POSTGRES, out_at + 1)
    assert node.judge(out_at + 1, holds_shards=False) is Standing.RECOVERING
    assert node.describe(out_at + 2)["rejoin_in_s"] == REJOIN - 1
    assert node.judge(out_at + 1 + REJOIN - 0.01, holds_shards=False) is Standing.RECOVERING
    assert node.judge(out_at + 1 + REJOIN, holds_shards=False) is Standing.OK


def test_failing_again_while_recovering_steps_it_out_again_at_once() -> None:
    node = health()
    out_at = stepped_out(node, 0.0)
    node.ok(Service.POSTGRES, out_at + 1)
    node.judge(out_at + 1, holds_shards=False)
    node.failed(Service.RABBITMQ, "cut", since=out_at + 2)
    assert node.judge(out_at + 2, holds_shards=False) is Standing.OUT


def test_each_recent_step_out_doubles_the_wait_up_to_the_cap() -> None:
    node = health()
    waits = []
    at = 0.0
    for _ in range(6):
        out_at = stepped_out(node, at)
        node.ok(Service.POSTGRES, out_at)
        node.judge(out_at, holds_shards=False)
        waits.append(node.rejoin_wait_s(out_at))
        at = out_at + node.rejoin_wait_s(out_at)
        assert node.judge(at, holds_shards=False) is Standing.OK
    assert waits == [REJOIN * min(2**n, MAX_BACKOFF) for n in range(6)]


def test_step_outs_older_than_the_window_are_forgotten() -> None:
    node = health()
    out_at = stepped_out(node, 0.0)
    node.ok(Service.POSTGRES, out_at)
    node.judge(out_at, holds_shards=False)
    node.judge(out_at + REJOIN, holds_shards=False)
    later = stepped_out(node, out_at + FLAP_WINDOW_S + 1)
    assert node.rejoin_wait_s(later) == REJOIN


@pytest.mark.parametrize("service", list(Service))
def test_any_service_can_step_the_node_out(service: Service) -> None:
    node = health()
    node.failed(service, "broken", since=0.0)
    node.judge(0.0, holds_shards=True)
    assert node.judge(BOUND, holds_shards=True) is Standing.OUT
    reason = str(node.reason(BOUND))
    assert reason.startswith("stepped out")
    assert service.value in reason


def test_a_slow_probe_makes_the_node_failing_but_never_steps_it_out() -> None:
    node = health()
    node.slow(Service.POSTGRES, since=0.0)
    assert node.judge(0.5, holds_shards=True) is Standing.FAILING
    assert node.failing(0.5) == {}  # readiness is not touched
    assert "postgres slow to answer" in str(node.reason(0.5))
    assert node.judge(BOUND + 1, holds_shards=True) is Standing.FAILING
    node.ok(Service.POSTGRES, BOUND + 1)
    assert node.judge(BOUND + 1, holds_shards=True) is Standing.OK


def test_a_slow_probe_that_fails_counts_from_when_it_began() -> None:
    node = health()
    node.slow(Service.RABBITMQ, since=1.0)
    node.judge(1.5, holds_shards=True)
    node.failed(Service.RABBITMQ, "no answer", since=1.0)
    assert node.judge(1.0 + BOUND, holds_shards=True) is Standing.OUT
