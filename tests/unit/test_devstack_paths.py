"""devstack keeps what it builds inside the repository's git-ignored .run/, never beside it."""

from pathlib import Path

from devstack import rabbitmq4

ROOT = Path(__file__).resolve().parents[2]


def test_the_rabbitmq4_chroot_lives_under_the_repositorys_run_folder() -> None:
    assert rabbitmq4.CHROOT == ROOT / ".run" / "rabbitmq4" / "chroot"
    assert ".run/" in (ROOT / ".gitignore").read_text().splitlines()
