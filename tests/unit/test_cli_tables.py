"""Tables that fit the terminal and a progress bar drawn only on one: pure functions."""

from __future__ import annotations

import io

import pytest

from dispatcher.cli import progress, tables

JOB_ID = "01JD3Q5W8Z6Y4X2V0T9R7P5N3M"
LONG_KEY = "billing.invoices.monthly-statement.regenerate-after-correction"
ROWS = [(JOB_ID, "scheduled", LONG_KEY, "2026-11-24T13:00:00Z", None)]
HEADER = ["id", "state", "routing key", "run at", "error"]


def test_a_table_wider_than_the_terminal_is_cut_to_its_width_and_keeps_the_ids() -> None:
    natural = tables.table(ROWS, HEADER, width=1000)
    assert max(len(line) for line in natural.splitlines()) > 60
    fitted = tables.table(ROWS, HEADER, width=60).splitlines()
    assert max(len(line) for line in fitted) <= 60
    assert fitted[1].startswith(JOB_ID + "  ")
    assert "…" in fitted[1]  # the routing key, the widest, was cut
    wider = tables.table(ROWS, HEADER, width=80).splitlines()
    assert max(len(line) for line in wider) <= 80
    assert f"{JOB_ID}  scheduled  billing.invoice…  2026-11-24T13:0…" == wider[1]


def test_a_table_that_fits_is_left_whole() -> None:
    assert "…" not in tables.table(ROWS, HEADER, width=200)
    assert LONG_KEY in tables.table(ROWS, HEADER, width=200)


def test_the_widest_columns_lose_first() -> None:
    # 40 + 10 + 20 and two gaps of 2 = 74: 14 too many, all taken from the widest column.
    assert tables.fit([40, 10, 20], 60) == [26, 10, 20]
    # Past the second widest, both come down together.
    assert tables.fit([40, 10, 20], 44) == [15, 10, 15]


def test_kept_columns_are_cut_only_when_the_others_cannot_make_room() -> None:
    assert tables.fit([26, 30], 40, keep=[0]) == [26, 12]
    assert tables.fit([26, 30], 16, keep=[0]) == [16, 0]  # the other left out, then the id cut


def test_a_narrow_terminal_shows_fewer_columns_rather_than_unreadable_ones() -> None:
    # A job's uuid, state, routing key, run at, error in 60 columns: the last two are left
    # out; what stays is readable and the id whole.
    assert tables.fit([36, 9, 62, 20, 5], 60, keep=[0]) == [36, 9, 11, 0, 0]
    rows = [("01a20dba-734a-7000-b557-5ef8eb365014", "scheduled", LONG_KEY, "2026-11-24", "")]
    lines = tables.table(rows, HEADER, width=60).splitlines()
    assert lines == [
        "id                                    state      routing key",
        "01a20dba-734a-7000-b557-5ef8eb365014  scheduled  billing.in…",
    ]


def test_a_terminal_too_narrow_for_every_column_still_gets_no_longer_line() -> None:
    lines = tables.table(ROWS, HEADER, width=12).splitlines()
    assert max(len(line) for line in lines) <= 12


def test_a_cut_cell_ends_with_an_ellipsis_and_a_multiline_cell_becomes_one_line() -> None:
    assert tables.clip("abcdefgh", 5) == "abcd…"
    assert tables.clip("abc", 5) == "abc"
    table = tables.table([("1", "Traceback:\n  boom")], ["id", "error"], width=80)
    assert table.splitlines()[1] == "1   Traceback: boom"


def test_the_width_comes_from_columns_and_none_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    assert tables.terminal_width() == 50
    assert max(len(line) for line in tables.table(ROWS, HEADER).splitlines()) <= 50
    monkeypatch.delenv("COLUMNS")
    # Under pytest stdout is captured, not a terminal: no limit, so pipes get whole lines.
    assert tables.terminal_width() is None
    assert LONG_KEY in tables.table(ROWS, HEADER)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_in_place_on_a_terminal() -> None:
    screen = Terminal()
    bar = progress.Bar(screen)
    bar(1, 4)
    bar(4, 4)
    bar.say("job x: 404")
    assert screen.getvalue() == (
        f"\r{progress.render(1, 4, 80)}\r{progress.render(4, 4, 80)}\njob x: 404\n"
    )


def test_the_bar_is_not_drawn_off_a_terminal() -> None:
    piped = io.StringIO()
    bar = progress.Bar(piped)
    bar(1, 4)
    bar.say("job x: 404")
    bar(4, 4)
    bar.end()
    assert piped.getvalue() == "job x: 404\n"


def test_the_bar_fits_a_narrow_terminal() -> None:
    assert progress.render(5, 10, 80) == f"[{'#' * 15}{'.' * 15}] 5/10"
    assert len(progress.render(5, 10, 20)) <= 20
    assert progress.render(5, 10, 8) == "5/10"
