"""Tables as a terminal shows them: columns padded to their widest cell and cut to the
terminal's width (``COLUMNS`` respected), ids kept whole as long as possible; pure but for
reading the width."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Sequence

GAP = "  "
ELLIPSIS = "…"
MIN_CELL = 8  # a column cut narrower than this says too little: left out instead


def terminal_width() -> int | None:
    """``$COLUMNS``, else the terminal's width; ``None`` (no limit) when stdout is no terminal."""
    return shutil.get_terminal_size(fallback=(0, 0)).columns or None


def table(
    rows: Sequence[Sequence[object]],
    header: Sequence[str],
    *,
    keep: Collection[int] = (0,),
    width: int | None = None,
) -> str:
    """Columns padded to their widest cell, cut to fit ``width`` (default: ``terminal_width()``)
    as ``fit`` says. The columns in ``keep`` (ids: what a person copies) are cut last."""
    cells = [[str(h) for h in header], *[[_flat(c) for c in row] for row in rows]]
    natural = [max(len(row[i]) for row in cells) for i in range(len(header))]
    width = terminal_width() if width is None else width
    widths = natural if width is None else fit(natural, width, keep)
    lines = (
        GAP.join(
            clip(cell, size).ljust(size) for cell, size in zip(row, widths, strict=True) if size
        )
        for row in cells
    )
    # The last resort of a terminal narrower than one character per column and the gaps.
    return "\n".join(line.rstrip()[:width] for line in lines)


def fit(natural: Sequence[int], width: int, keep: Collection[int] = ()) -> list[int]:
    """Column widths that with the gaps between them fit ``width`` (0: the column is left out).
    The widest column loses a character at a time, the columns not kept down to ``MIN_CELL``;
    when that is not enough the last of them are left out (a narrow terminal shows fewer
    columns, not unreadable ones); then the kept ones are cut, down to one character."""
    shown = list(range(len(natural)))
    while True:
        widths = [natural[i] if i in shown else 0 for i in range(len(natural))]
        others = [i for i in shown if i not in keep]
        excess = _shrink(widths, others, _excess(widths, width), MIN_CELL)
        if excess <= 0 or not others:
            break
        shown.remove(others[-1])
    excess = _shrink(widths, shown, excess, MIN_CELL)
    _shrink(widths, shown, excess, 1)
    return widths


def _excess(widths: Sequence[int], width: int) -> int:
    shown = [size for size in widths if size]
    return sum(shown) + len(GAP) * (len(shown) - 1) - width


def _shrink(widths: list[int], columns: Sequence[int], excess: int, floor: int) -> int:
    """Takes up to ``excess`` characters from ``columns``, the widest first, none below
    ``floor`` (nor below its own width); returns what is still to take."""
    while excess > 0:
        widest = max(columns, key=lambda i: widths[i], default=None)
        if widest is None or widths[widest] <= floor:
            return excess
        widths[widest] -= 1
        excess -= 1
    return excess


def clip(cell: str, size: int) -> str:
    """The cell cut to ``size`` characters, its last one ``…`` when it was cut."""
    if len(cell) <= size:
        return cell
    return cell[: size - 1] + ELLIPSIS if size > 1 else cell[:size]


def _flat(cell: object) -> str:
    # One line per row: a multi-line error would break the table.
    return "" if cell is None else " ".join(str(cell).split())
