"""A tiny renderer for the CLI's readable output: columns padded to their widest cell."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, gap: int = 2) -> str:
    """Left-aligned columns separated by ``gap`` spaces, a header line first; no trailing spaces.
    Every row has as many cells as ``headers``."""
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)} has {len(row)} cells, the headers {len(headers)}")
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        (" " * gap).join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *rows]
    ]
    return "\n".join(lines)
