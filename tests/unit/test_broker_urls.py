"""Several broker URLs: the comma-separated syntax, its refusals (naming the setting, never
echoing a password), and the vhost they share."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumers_sdk import broker_urls
from dispatcher.settings import Settings

NODES = (
    "amqp://app:s3cret@rabbit-1:5672/jobs",
    "amqp://app:s3cret@rabbit-2:5673/jobs",
    "amqps://app:s3cret@rabbit-3:5671/jobs?cafile=/etc/ca.pem",
)


def test_one_url_is_a_list_of_one() -> None:
    assert broker_urls.parse("amqp://guest:guest@127.0.0.1:5672/") == (
        "amqp://guest:guest@127.0.0.1:5672/",
    )


def test_comma_separated_urls_keep_their_order_without_the_spaces() -> None:
    assert broker_urls.parse(" , ".join(NODES)) == NODES


def test_a_list_of_urls_is_taken_as_it_is() -> None:
    assert broker_urls.parse(list(NODES)) == NODES


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ("", "broker URL 1 of 1 is empty"),
        (f"{NODES[0]},,{NODES[1]}", "broker URL 2 of 3 is empty"),
        (f"{NODES[0]},", "broker URL 2 of 2 is empty"),
        (f"{NODES[0]},http://app:s3cret@rabbit-2/jobs", "URL 2 of 2: the scheme must be amqp"),
        ("rabbit-1:5672", "URL 1 of 1: the scheme must be amqp"),
        ("amqp:///jobs", "URL 1 of 1 names no host"),
        ("amqp://app:s3cret@rabbit-1:port/jobs", "URL 1 of 1 is not a URL"),
        (f"{NODES[0]},amqp://app:s3cret@rabbit-2/other", "different virtual hosts"),
    ],
)
def test_bad_broker_urls_are_refused_by_position(value: str, refusal: str) -> None:
    with pytest.raises(broker_urls.BrokerUrlError, match=refusal) as refused:
        broker_urls.parse(value)
    assert "s3cret" not in str(refused.value)


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(broker_urls.BrokerUrlError, match="no broker URL"):
        broker_urls.parse([])


def test_the_vhost_is_the_first_urls() -> None:
    assert broker_urls.vhost(",".join(NODES)) == "jobs"
    assert broker_urls.vhost("amqp://guest:guest@127.0.0.1:5672/") == "/"
    assert broker_urls.vhost("amqp://guest:guest@127.0.0.1:5672/%2F") == "/"
    assert broker_urls.vhost(["amqp://g:g@h/a%20b"]) == "a b"


def test_the_setting_takes_a_cluster_and_lists_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_AMQP_URL", ",".join(NODES))
    settings = Settings()
    assert settings.amqp_urls() == NODES
    assert settings.amqp_vhost() == "jobs"


@pytest.mark.parametrize(
    "value", [f"{NODES[0]},", "redis://app:s3cret@rabbit-1/jobs", f"{NODES[0]}, ,{NODES[1]}"]
)
def test_the_setting_refuses_bad_urls_at_startup_naming_itself(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("DISPATCHER_AMQP_URL", value)
    with pytest.raises(ValidationError, match="DISPATCHER_AMQP_URL") as refused:
        Settings()
    assert "s3cret" not in str(refused.value)


def test_the_unroutable_queue_is_quorum_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().unroutable_queue_type == "quorum"
    monkeypatch.setenv("DISPATCHER_UNROUTABLE_QUEUE_TYPE", "classic")
    assert Settings().unroutable_queue_type == "classic"


def test_a_default_parameter_is_added_where_a_url_does_not_set_it() -> None:
    urls = broker_urls.with_default(
        "amqp://a:5672/v,amqp://b:5672/v?heartbeat=30,amqp://c:5672/v?name=x", "heartbeat", "5"
    )
    assert urls == (
        "amqp://a:5672/v?heartbeat=5",
        "amqp://b:5672/v?heartbeat=30",
        "amqp://c:5672/v?name=x&heartbeat=5",
    )
