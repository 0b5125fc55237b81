"""``frames.supported``: the framed batch writer runs only on an aiormq release it was tested
with and a channel that has the private state it uses; otherwise it names the reason."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from dispatcher.amqp import frames


def channel_state(**overrides: object) -> SimpleNamespace:
    state: dict[str, object] = {
        "lock": asyncio.Lock(),
        "delivery_tag": 0,
        "confirmations": {},
        "write_queue": asyncio.Queue(),
        "number": 1,
        "max_content_size": 131_064,
        "create_future": lambda: None,
        "publisher_confirms": True,
    }
    state.update(overrides)
    return SimpleNamespace(**{k: v for k, v in state.items() if v is not None})


def test_the_installed_aiormq_is_inside_the_tested_range() -> None:
    assert frames.supported(channel_state()) is None


def test_a_channel_with_the_state_it_uses_on_the_tested_release_is_supported() -> None:
    low, high = frames.TESTED_AIORMQ
    for version in {low, high}:
        assert frames.supported(channel_state(), aiormq_version=".".join(map(str, version))) is None


@pytest.mark.parametrize("version", ["7.2.3", "7.2.5", "7.3.0", "8.0.0", "6.9.9", "7.2.4.post1"])
def test_a_release_outside_the_tested_range_gives_the_reason(version: str) -> None:
    reason = frames.supported(channel_state(), aiormq_version=version)
    assert reason is not None
    assert f"aiormq {version} is outside the range tested" in reason


@pytest.mark.parametrize("name", sorted(frames.CHANNEL_STATE))
def test_a_missing_private_attribute_gives_its_name(name: str) -> None:
    low, _ = frames.TESTED_AIORMQ
    version = ".".join(map(str, low))
    reason = frames.supported(channel_state(**{name: None}), aiormq_version=version)
    assert reason is not None
    assert f"no {name} attribute" in reason


def test_an_attribute_of_another_type_gives_its_name() -> None:
    low, _ = frames.TESTED_AIORMQ
    reason = frames.supported(
        channel_state(confirmations=[]), aiormq_version=".".join(map(str, low))
    )
    assert reason is not None
    assert "no confirmations attribute" in reason


def test_a_channel_without_confirms_or_create_future_is_not_supported() -> None:
    low, _ = frames.TESTED_AIORMQ
    version = ".".join(map(str, low))
    assert "create_future" in str(
        frames.supported(channel_state(create_future=None), aiormq_version=version)
    )
    assert "publisher confirms" in str(
        frames.supported(channel_state(publisher_confirms=False), aiormq_version=version)
    )
