"""API keys, pure parts: the DISPATCHER_API_KEYS format, hashing, what a Principal grants."""

import hashlib

import pytest
from pydantic import ValidationError

from dispatcher.auth import api_keys
from dispatcher.settings import Settings
from tests.support.words import WITHIN_CASES

TOKEN_A = "tok-aaaaaaaaaaaaaaaa"
TOKEN_B = "tok-bbbbbbbbbbbbbbbb"


def test_static_keys_parse_scope_namespace_and_prefixes() -> None:
    admin, producer, bare = api_keys.parse_static(
        f"{TOKEN_A}:admin, {TOKEN_B}:producer:billing:billing.|orders.v2:,"
        "tok-cccccccccccccccc:producer"
    )
    assert admin.digest == hashlib.sha256(TOKEN_A.encode()).digest()
    assert admin.principal == api_keys.Principal(key="static:1", scope=api_keys.Scope.ADMIN)
    assert producer.principal == api_keys.Principal(
        key="static:2",
        scope=api_keys.Scope.PRODUCER,
        namespace="billing",
        routing_key_prefixes=("billing.", "orders.v2:"),
    )
    assert bare.principal.namespace is None
    assert bare.principal.routing_key_prefixes == ()


def test_no_static_keys_is_an_empty_setting() -> None:
    assert api_keys.parse_static("") == []
    assert Settings().static_keys() == []


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (f"{TOKEN_A}:root", "scope must be one of"),
        ("short:admin", "at least 16 characters"),
        (f"{TOKEN_A}:admin:billing", "only producer and limits keys take a namespace"),
        (f"{TOKEN_A}:producer:bad namespace", "a namespace is"),
        (f"{TOKEN_A}:producer::orders.*", "a routing-key prefix is"),
        (f"{TOKEN_A}:admin,,{TOKEN_B}:admin", "entry 2 is empty"),
        (f"{TOKEN_A}:admin,{TOKEN_A}:producer", "repeats the token"),
    ],
)
def test_invalid_static_keys_are_refused_without_echoing_the_token(
    text: str, complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint) as refused:
        api_keys.parse_static(text)
    assert TOKEN_A not in str(refused.value)


def test_settings_refuse_invalid_api_keys_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPATCHER_API_KEYS", f"{TOKEN_A}:superuser")
    with pytest.raises(ValidationError, match="api_keys") as refused:
        Settings()
    assert TOKEN_A not in str(refused.value)


def test_settings_never_show_the_static_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_API_KEYS", f"{TOKEN_A}:admin")
    settings = Settings()
    assert TOKEN_A not in repr(settings)
    assert TOKEN_A not in str(settings.model_dump())
    assert [key.principal.scope for key in settings.static_keys()] == [api_keys.Scope.ADMIN]


def test_new_tokens_are_unique_high_entropy_and_hashed_with_sha256() -> None:
    tokens = {api_keys.new_token() for _ in range(100)}
    assert len(tokens) == 100
    token = tokens.pop()
    assert token.startswith(api_keys.TOKEN_PREFIX)
    assert len(token) >= len(api_keys.TOKEN_PREFIX) + 43  # 32 random bytes, base64url
    assert api_keys.digest(token) == hashlib.sha256(token.encode()).digest()


def test_admin_has_every_scope_and_sees_every_namespace() -> None:
    admin = api_keys.Principal(key="k", scope=api_keys.Scope.ADMIN)
    assert all(admin.has(scope) for scope in api_keys.Scope)
    assert admin.namespace_filter is None
    assert admin.may_route("anything.at.all")


def test_producer_is_confined_to_its_scope_namespace_and_prefixes() -> None:
    producer = api_keys.Principal(
        key="k",
        scope=api_keys.Scope.PRODUCER,
        namespace="billing",
        routing_key_prefixes=("billing.",),
    )
    assert producer.has(api_keys.Scope.PRODUCER)
    assert not producer.has(api_keys.Scope.ADMIN)
    assert not producer.has(api_keys.Scope.MONITOR)
    assert producer.namespace_filter == "billing"
    assert producer.may_route("billing.invoice")
    assert not producer.may_route("billingx.invoice")
    assert not producer.may_route("orders.expire")
    default = api_keys.Principal(key="k", scope=api_keys.Scope.PRODUCER)
    assert default.namespace_filter == ""  # the default namespace, not every namespace


@pytest.mark.parametrize(("prefix", "routing_key", "within"), WITHIN_CASES)
def test_a_prefix_names_whole_words(prefix: str, routing_key: str, within: bool) -> None:
    key = api_keys.Principal(key="k", scope=api_keys.Scope.PRODUCER, routing_key_prefixes=(prefix,))
    assert key.may_route(routing_key) is within
    assert key.routing_key_filter == [prefix.rstrip(".")]


def test_an_admin_and_a_key_without_prefixes_filter_nothing() -> None:
    admin = api_keys.Principal(key="k", scope=api_keys.Scope.ADMIN)
    assert admin.routing_key_filter is None
    assert api_keys.Principal(key="k", scope=api_keys.Scope.PRODUCER).routing_key_filter is None


@pytest.mark.parametrize(
    ("namespace", "prefixes"),
    [("team\n", []), (None, ["billing.\n"]), (None, ["."]), (None, [".billing"])],
)
def test_a_grant_ending_in_a_newline_or_without_a_word_is_refused(
    namespace: str | None, prefixes: list[str]
) -> None:
    with pytest.raises(ValueError, match=r"namespace|prefix"):
        api_keys.check_grant(api_keys.Scope.PRODUCER, namespace, prefixes)


def test_a_routing_key_ending_in_a_newline_is_refused() -> None:
    from consumers_sdk import validation

    assert validation.routing_key_problem("billing.invoice\n") is not None
    assert validation.routing_key_problem("billing.invoice") is None
