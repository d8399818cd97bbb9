"""Terminal output: result tables via rich."""

from __future__ import annotations

import pyarrow as pa
from rich.console import Console
from rich.table import Table

__all__ = ["print_table"]


def print_table(table: pa.Table, limit: int = 20, console: Console | None = None) -> None:
    """Print the first ``limit`` rows of ``table`` and its row count."""
    console = console or Console()
    out = Table(*table.column_names, show_lines=False)
    for row in table.slice(0, limit).to_pylist():
        out.add_row(*("NULL" if v is None else str(v) for v in row.values()))
    console.print(out)
    more = f" (showing {limit})" if table.num_rows > limit else ""
    console.print(f"{table.num_rows} rows{more}")
