"""Terminal output: result tables and the live progress line, via rich.

Off a terminal (a pipe, a file, a notebook, pytest's capture), a result table
is printed by DataFusion itself, as ``datafusion.DataFrame.show`` prints it
(:func:`show_table`): every column and every cell whole, never wrapped to a
width nobody reads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
from datafusion import SessionContext
from rich.console import Console
from rich.table import Table

__all__ = ["print_table", "show_table", "with_progress"]


def print_table(table: pa.Table, limit: int = 20, console: Console | None = None) -> None:
    """Print the first ``limit`` rows of ``table`` and its row count."""
    console = console or Console()
    out = Table(*table.column_names, show_lines=False)
    for row in table.slice(0, limit).to_pylist():
        out.add_row(*("NULL" if v is None else str(v) for v in row.values()))
    console.print(out)
    more = f" (showing {limit})" if table.num_rows > limit else ""
    console.print(f"{table.num_rows} rows{more}")


def show_table(table: pa.Table, num: int = 20) -> None:
    """Print the first ``num`` rows of ``table`` on stdout, as ``datafusion.DataFrame.show`` does.

    Called by :meth:`~distfusion.context.DistributedDataFrame.show` with the
    rows of its query run with ``LIMIT num``. Off a terminal, DataFusion's
    ``show`` prints them itself: ``DataFrame()`` and the table in arrow's
    pretty format, a column per field however many there are and cells
    whole, NULL as an empty cell, or ``DataFrame has no rows``; so the output
    equals single-node DataFusion's for the same query (a file, a pipe, a
    notebook, pytest's capture). On a terminal (rich's detection, as
    :func:`print_table`), a rich table fitted to its width and the row count.
    """
    if Console().is_terminal:
        print_table(table, limit=num)
        return
    SessionContext().from_arrow(table).show(num)


def with_progress(
    batches: Iterator[pa.RecordBatch],
    observer,
    console: Console | None = None,
    every_s: float = 0.5,
) -> Iterator[pa.RecordBatch]:
    """``batches``, with a live status line on stderr while they are read.

    Every ``every_s`` seconds a thread calls ``observer.refresh()`` and shows
    ``observer.progress().describe()`` (a
    :class:`~distfusion.metrics.QueryObserver`: stages and tasks done, rows,
    seconds). The line is transient: it is gone when the batches end, so the
    result printed next is not drawn over; on a non-terminal nothing is drawn.
    Closing the returned iterator closes ``batches``.
    """
    console = console or Console(stderr=True)
    stop = threading.Event()
    with console.status("distfusion: starting") as status:

        def loop() -> None:
            while not stop.wait(every_s):
                observer.refresh()
                status.update(f"distfusion: {observer.progress().describe()}")

        thread = threading.Thread(target=loop, name="distfusion-progress", daemon=True)
        thread.start()
        try:
            yield from batches
        finally:
            stop.set()
            thread.join()
            close = getattr(batches, "close", None)
            if close is not None:
                close()
