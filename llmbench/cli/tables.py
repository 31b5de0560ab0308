"""Rich rendering of the bench layer's plain report views (right-aligned numbers)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from llmbench.bench.report.views import View


def rich_table(view: View) -> Table:
    # A view is plain text (also Markdown, CSV, HTML): "[tp=2]" in a label is text, not Rich markup.
    table = Table(title=escape(view.title), title_justify="left", show_edge=False, pad_edge=False)
    for i, (header, numeric) in enumerate(zip(view.headers, view.numeric, strict=True)):
        widest = max((len(row[i]) for row in view.rows), default=0)
        # On a narrow terminal Rich shrinks columns; keep labels readable and numbers whole where it can.
        table.add_column(
            escape(header),
            justify="right" if numeric else "left",
            min_width=min(widest, 9 if numeric else 14),
            overflow="fold",
        )
    for row in view.rows:
        table.add_row(*map(escape, row))
    return table
