"""Queries run in place: single-node DataFusion on the coordinator's own context.

A query small enough (``RuntimeProfile.in_place_bytes`` of scans), or planned as one
stage reading files and memory tables (:func:`runs_in_place`), runs as the
coordinator's DataFusion planned it, with no Substrait round trip and no task
(:func:`run_in_place`); a query that cannot be distributed runs whole here
(:func:`on_coordinator`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import pyarrow as pa
from datafusion import DataFrame

from distfusion.errors import DistfusionError
from distfusion.io.sources import TableSource, WorkUnit, check_source_files
from distfusion.metrics.observer import observer_for
from distfusion.metrics.task import TaskMeter
from distfusion.planner.config import DistributedConfig
from distfusion.protocol.errors import task_error
from distfusion.stages import StageGraph
from distfusion.worker.execute_task import COORDINATOR, stream_batches


def on_coordinator(df: DataFrame) -> Iterator[pa.RecordBatch]:
    """``df`` run by single-node DataFusion in this process, as Arrow batches.

    The wait for each batch can be interrupted (:class:`ResultStream` closed
    from another thread).
    """
    yield from stream_batches(df, lambda: False)


def runs_in_place(
    graph: StageGraph, config: DistributedConfig, not_on_coordinator: Collection[str] = ()
) -> bool:
    """Whether ``graph`` runs as single-node DataFusion on the coordinator's own context.

    A plan of one stage (the head, one task, on the coordinator anyway) that
    reads only files and memory tables is the query as DataFusion planned it
    here: running ``df`` itself on the coordinator's context gives the same
    rows without a Substrait round trip or a fresh task context, and reuses
    that context's caches of file listings and Parquet footers (on an object
    store, a request each per file otherwise). Not when the user set a memory
    budget per task (the head task runs within it), nor when it reads a
    table of ``not_on_coordinator`` (names of tables the coordinator's
    context cannot read: a Delta table on an object store with column
    mapping or deletion vectors, whose delta-rs reader finds no store
    there; a pruned read of one counts by its registered name); its task
    reads that table's files as every task does.
    """
    return (
        len(graph.stages) == 1
        and not graph.head.inputs
        and not any(s.source.streamed for s in graph.head.scans)
        and not any(
            s.source.options.get("table", s.source.name) in not_on_coordinator
            for s in graph.head.scans
        )
        and config.memory_per_task_bytes is None
    )


def run_in_place(
    df: DataFrame,
    query_id: str,
    scans: list[tuple[TableSource, tuple[WorkUnit, ...]]],
    stage_id: int = 1,
    operators: bool = True,
) -> Iterator[pa.RecordBatch]:
    """``df`` run here as one task of stage ``stage_id``: its files checked, its metrics reported.

    Args:
        df: the query, planned on the coordinator's context.
        query_id: the run's id (its observer gets the task's metrics).
        scans: ``(source, work units)`` of every table it reads.
        stage_id: the stage the task's metrics are reported under.
        operators: collect DataFusion's operator metrics from the executed
            plan (~0.5 ms); False for a query never planned, whose metrics
            show no stage.

    Raises:
        TaskError: a file is gone, or DataFusion failed (worker ``coordinator``).
    """
    meter = TaskMeter(
        stage_id,
        0,
        COORDINATOR,
        0,
        sum(u.size_bytes for _, units in scans for u in units),
        operators=operators,
    )
    rows = nbytes = 0
    try:
        for source, units in scans:
            check_source_files(source, units)
        meter.executed(df)
        for batch in on_coordinator(df):
            rows += batch.num_rows
            nbytes += batch.nbytes
            yield batch
    except DistfusionError:
        raise
    except Exception as exc:  # DataFusion's bare Exception, a missing file
        raise task_error(stage_id, 0, COORDINATOR, exc) from exc
    observer_for(query_id).task_finished(meter.finish(None, rows, nbytes))
