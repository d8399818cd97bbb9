"""Terminal output: result tables and the live progress line, via rich."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
from rich.console import Console
from rich.table import Table

__all__ = ["print_table", "with_progress"]


def print_table(table: pa.Table, limit: int = 20, console: Console | None = None) -> None:
    """Print the first ``limit`` rows of ``table`` and its row count."""
    console = console or Console()
    out = Table(*table.column_names, show_lines=False)
    for row in table.slice(0, limit).to_pylist():
        out.add_row(*("NULL" if v is None else str(v) for v in row.values()))
    console.print(out)
    more = f" (showing {limit})" if table.num_rows > limit else ""
    console.print(f"{table.num_rows} rows{more}")


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
