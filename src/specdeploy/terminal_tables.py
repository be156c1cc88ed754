"""Rich tables that stay legible on an 80-column terminal.

A table shows its key columns only (the rest stay in the run's files, the JSON output and the HTML report),
with light borders. Only the columns named to wrap break a value over lines (folding long words); the
others keep each value on one line, and would show an ellipsis were the terminal too narrow for them.
"""

from __future__ import annotations

from rich import box
from rich.table import Table


def num(value: float | None, digits: int = 1) -> str:
    """A figure with thousands separators and `digits` decimals; "-" for none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def narrow_table(title: str | None = None, caption: str | None = None) -> Table:
    return Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )


def add_columns(
    table: Table, headers: tuple[str, ...], left: tuple[str, ...] = (), wrap: tuple[str, ...] = ()
) -> None:
    """Right-aligned columns except `left`; only `wrap` columns may break a value over lines (folding it)."""
    for header in headers:
        table.add_column(
            header,
            justify="left" if header in left else "right",
            no_wrap=header not in wrap,
            overflow="fold" if header in wrap else "ellipsis",
        )
