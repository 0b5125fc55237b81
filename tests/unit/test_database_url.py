"""The database URL the store connects with: several hosts reach the writable one."""

from dispatcher.store import db


def test_a_multi_host_url_without_a_target_is_given_read_write() -> None:
    two = "postgresql://u@h1:1,h2:2/db"
    assert db.writable(two) == f"{two}?target_session_attrs=read-write"
    assert db.writable(f"{two}?sslmode=require") == (
        f"{two}?sslmode=require&target_session_attrs=read-write"
    )
    chosen = f"{two}?target_session_attrs=primary"
    assert db.writable(chosen) == chosen
    one = "postgresql://u@h1:1/db"
    assert db.writable(one) == one
