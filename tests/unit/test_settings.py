from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dispatcher.settings import Settings

ROOT = Path(__file__).parents[2]


def test_defaults_are_the_embedded_configuration() -> None:
    settings = Settings()
    assert settings.zk_hosts == ""  # single-node mode
    assert settings.http_port == 8080
    assert settings.exchange == "dispatcher.jobs"
    assert settings.shard_count == 256
    assert settings.max_payload_bytes == 256 * 1024


def test_environment_is_read_with_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_HTTP_PORT", "9090")
    monkeypatch.setenv("DISPATCHER_LEASE_S", "2.5")
    settings = Settings()
    assert settings.http_port == 9090
    assert settings.lease_s == 2.5


def test_invalid_setting_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_SHARD_COUNT", "0")
    with pytest.raises(ValidationError, match="shard_count"):
        Settings()


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.http_port = 1  # type: ignore[misc]


def test_compose_uses_the_settings_variable_names() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    names = set(compose["services"]["dispatcher"]["environment"])
    known = {f"DISPATCHER_{field.upper()}" for field in Settings.model_fields}
    assert names <= known, names - known
    required = {"DISPATCHER_DATABASE_URL", "DISPATCHER_AMQP_URL", "DISPATCHER_ZK_HOSTS"}
    assert required <= names


def test_the_console_links_to_the_management_ui_without_its_credentials() -> None:
    settings = Settings(amqp_management_url="https://ops:secret@mq.internal:15671/rabbit/")
    assert settings.rabbitmq_ui() == "https://mq.internal:15671/rabbit"
    assert Settings(rabbitmq_ui_url="https://mq.example/").rabbitmq_ui() == "https://mq.example"


def test_zk_auth_is_a_user_and_a_password_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_ZK_AUTH", "dispatcher:pa55word")
    settings = Settings()
    assert settings.zk_auth.get_secret_value() == "dispatcher:pa55word"
    assert "pa55word" not in repr(settings) + str(settings)
    for bad in ("pa55word-alone", "dispatcher:", ":pa55word"):
        monkeypatch.setenv("DISPATCHER_ZK_AUTH", bad)
        with pytest.raises(ValidationError, match="zk_auth") as refused:
            Settings()
        assert "pa55word" not in str(refused.value)


def test_a_client_may_hold_a_quarter_of_the_connections_unless_told_otherwise() -> None:
    assert Settings().connections_per_client() == 256
    assert Settings(http_max_connections=8).connections_per_client() == 2
    assert Settings(http_max_connections=3).connections_per_client() == 1
    behind_a_balancer = Settings(http_max_connections=100, http_max_connections_per_client=100)
    assert behind_a_balancer.connections_per_client() == 100
    assert Settings(http_max_connections_per_client=5000).connections_per_client() == 1024
