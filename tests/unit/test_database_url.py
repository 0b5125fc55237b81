"""The database URL the store connects with: several hosts reach the writable one."""

from dispatcher.store import servers


def test_a_multi_host_url_without_a_target_is_given_read_write() -> None:
    two = "postgresql://u@h1:1,h2:2/db"
    assert servers.writable(two) == f"{two}?target_session_attrs=read-write"
    assert servers.writable(f"{two}?sslmode=require") == (
        f"{two}?sslmode=require&target_session_attrs=read-write"
    )
    chosen = f"{two}?target_session_attrs=primary"
    assert servers.writable(chosen) == chosen
    one = "postgresql://u@h1:1/db"
    assert servers.writable(one) == one


def test_each_host_of_a_url_gets_a_url_of_its_own() -> None:
    url = "postgresql://u:p@h1:1,[::1]:2,h3/db?sslmode=require"
    assert servers.each_server(url) == [
        "postgresql://u:p@h1:1/db?sslmode=require",
        "postgresql://u:p@[::1]:2/db?sslmode=require",
        "postgresql://u:p@h3/db?sslmode=require",
    ]
    one = "postgresql://u@h1:1/db"
    assert servers.each_server(one) == [one]
