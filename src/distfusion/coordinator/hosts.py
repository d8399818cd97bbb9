"""What the mixins of the API classes read of the class they are part of (for type checking).

:class:`~distfusion.context.DistributedContext` is built from the mixins
``StatementRouting``, ``TableCatalog`` (here in ``coordinator/``),
``Readers`` (``dataframe/``), ``TableInserts``, ``TableMerges`` and
``CatalogMounts`` (``table_write/``); each reads the context's state and
calls methods another mixin (or the context) defines.
:class:`~distfusion.context.DistributedDataFrame` likewise from
``QueryExecution``, ``ExplainRendering``, ``Transformations`` and
``TableWrites``. Those classes sit above the mixins' layers and cannot be
named there, so each mixin derives from :class:`ContextHost` or
:class:`FrameHost`: class-level annotations of the shared attributes (no value,
so nothing at run time) and, under ``TYPE_CHECKING`` only, the signatures of
the methods defined elsewhere in the class. At run time both are empty
classes; the API class's own ``__init__`` sets the attributes.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from datafusion import DataFrame, SessionContext

from distfusion import udfs
from distfusion.io import object_store
from distfusion.io.sources import TableSource
from distfusion.planner.config import DistributedConfig
from distfusion.work_unit_feed.table import FeedTableSource

if TYPE_CHECKING:
    from distfusion.coordinator.adaptive import AdaptiveReport
    from distfusion.coordinator.query_run import Runtime
    from distfusion.coordinator.results import ResultStream
    from distfusion.metrics.query import QueryMetrics
    from distfusion.stages import StageGraph
    from distfusion.work_unit_feed.feed import FeedPartitionMetrics

__all__ = ["ContextHost", "FrameHost"]


class ContextHost:
    """The state and methods the mixins of ``DistributedContext`` share (see the module)."""

    ctx: SessionContext  # its DataFusion session
    config: DistributedConfig
    closed: bool
    functions: udfs.Functions
    stores: object_store.Stores
    sources: dict[str, TableSource]  # table -> where its rows come from
    _runtime: Runtime | None  # None until first use
    _written: bool
    _feed_sources: dict[str, FeedTableSource]
    _held: dict[str, object]
    _file_views: set[str]
    _not_on_coordinator: dict[str, str]

    if TYPE_CHECKING:

        @property
        def runtime(self) -> Runtime: ...

        def sql(self, query: str) -> Any: ...  # a DistributedDataFrame

        def register_object_store(self, scheme: str, store: Any, host: str | None = None) -> None:
            ...

        def register_parquet(
            self,
            name: str,
            path: str | os.PathLike | list,
            schema: pa.Schema | None = None,
            table_partition_cols: list[tuple[str, str | pa.DataType]] | None = None,
        ) -> None: ...

        def register_csv(
            self,
            name: str,
            path: str | os.PathLike | list,
            schema: pa.Schema | None = None,
            has_header: bool = True,
            delimiter: str = ",",
        ) -> None: ...

        def register_json(
            self, name: str, path: str | os.PathLike | list, schema: pa.Schema | None = None
        ) -> None: ...

        def register_table(self, name: str, table: Any, max_rows_per_unit: int = 65536) -> None:
            ...

        def register_feed_table(self, name: str, source: FeedTableSource) -> None: ...

        def register_delta(
            self,
            name: str,
            table: Any,
            version: int | None = None,
            storage_options: dict[str, str] | None = None,
            timestamp: datetime.datetime | str | None = None,
        ) -> None: ...

        def register_iceberg(
            self,
            name: str,
            table: Any,
            snapshot_id: int | None = None,
            as_of: datetime.datetime | int | None = None,
            *,
            tasks: int | None = None,
        ) -> None: ...

        def _register_delta_files(self, name: str, dt: Any, keep: set[int]) -> None: ...

        def _stores_for(self, path: str, extension: str | None = None) -> str: ...

        def _add(self, source: TableSource) -> None: ...

        def _forget(self, name: str) -> None: ...

        def _reread_memory_tables(self) -> None: ...

        def _catalog_statement(self, sql: str) -> tuple[Any, str]: ...

        def _catalog_table(self, name: str) -> str: ...

        def _insert_into_table(self, sql: str) -> Any: ...

        def _merge_into_table(self, sql: str) -> Any: ...


class FrameHost:
    """The state and methods the mixins of ``DistributedDataFrame`` share (see the module)."""

    context: ContextHost  # the DistributedContext it was made on
    df: DataFrame  # the DataFusion DataFrame it wraps (made on ``context.ctx``)
    label: str
    last_run: AdaptiveReport | None
    _metrics: QueryMetrics | None
    _graph: StageGraph | None
    _plan_bytes: bytes | None
    _coordinator_only: str | None
    _ran: list[str] | None
    _small: tuple[bool, list[str], int, int] | None  # see QueryExecution._small_in_place
    _in_place: DataFrame | None

    if TYPE_CHECKING:

        def schema(self) -> pa.Schema: ...

        def _is_query(self) -> bool: ...

        def coordinator_only(self) -> str | None: ...

        def runs_in_place(self) -> str | None: ...

        def stage_graph(self) -> StageGraph: ...

        def explain(
            self, verbose: bool = False, analyze: bool = False, format: str = "text"
        ) -> str: ...

        def feed_metrics(self) -> dict[str, list[FeedPartitionMetrics]]: ...

        def execute_stream(self, progress: bool = False) -> ResultStream: ...

        def collect(self, progress: bool = False) -> list[pa.RecordBatch]: ...

        def to_arrow_table(self, progress: bool = False) -> pa.Table: ...
