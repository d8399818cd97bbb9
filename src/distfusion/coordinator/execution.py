"""A DataFrame's query run: where it runs, its Substrait plan, its stages, its metrics.

:class:`QueryExecution` is the part of
:class:`~distfusion.context.DistributedDataFrame` that runs the query: the
optimized plan to Substrait (or the reason it runs on the coordinator only),
the stage graph (planned again as stages finish, with adaptive execution), the
choice between running in place, on the coordinator only or on the runtime,
the observer that gathers its metrics, and file writes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
from datafusion import DataFrame
from datafusion.substrait import Producer
from substrait.proto import Plan

from distfusion.coordinator.adaptive import AdaptiveReport, plan_final, run_adaptive
from distfusion.coordinator.checks import (
    check_coordinator_reads,
    check_open,
    check_spark_reads,
    first_line,
    lost_in_substrait,
    scanned_bytes,
)
from distfusion.coordinator.explain import coordinator_graph
from distfusion.coordinator.hosts import FrameHost
from distfusion.coordinator.in_place import (
    on_coordinator,
    run_in_place,
    runs_in_place,
)
from distfusion.coordinator.query_run import MapsHeadParts, QueryRun, WritesHeadParts
from distfusion.coordinator.results import map_head_parts, named, write_head_part
from distfusion.coordinator.statements import writes
from distfusion.display import with_progress
from distfusion.errors import NotDistributableError, PlanningError
from distfusion.io import object_store
from distfusion.io.write import FileCommitter, WriteSpec, WrittenFile, write_task
from distfusion.metrics.observer import QueryObserver, observing
from distfusion.metrics.query import build_query_metrics
from distfusion.metrics.render import format_bytes
from distfusion.planner.config import PlannerConfig, RuntimeProfile
from distfusion.planner.fragment import MaterializedStage
from distfusion.planner.plan import plan_stages, prepare_substrait, rewrite_joins
from distfusion.planner.write_from_producer import write_from_producer
from distfusion.session import SessionSettings
from distfusion.stages import StageGraph
from distfusion.substrait_plan.decode import consume_plan, fits_decoder

log = logging.getLogger(__name__)


class QueryExecution(FrameHost):
    """The runs of a :class:`~distfusion.context.DistributedDataFrame`'s query (a mixin).

    Reads and sets the frame's ``df``, ``context``, ``label``, ``last_run``
    and its caches (``_plan_bytes``, ``_coordinator_only``, ``_graph``,
    ``_small``, ``_ran``, ``_metrics``).
    """

    def _substrait(self) -> bytes | None:
        """The optimized query as Substrait plan bytes (made once); None when it has none.

        When DataFusion's producer cannot express the query (``WITH RECURSIVE``,
        ``UNNEST``, a ``LEFT JOIN ... USING``), or the plan would lose meaning on
        the way (:func:`lost_in_substrait`), the reason is kept for
        :meth:`coordinator_only`.
        """
        if self._plan_bytes is None and self._coordinator_only is None:
            ctx = self.context
            if writes(self.df):
                self._coordinator_only = "a write (INSERT, COPY, ...) runs in DataFusion"
                return None
            logical = self.df.optimized_logical_plan()
            try:
                produced = Producer.to_substrait_plan(logical, ctx.ctx).encode()
            except Exception as exc:  # DataFusion raises bare Exception
                self._coordinator_only = (
                    f"DataFusion's Substrait producer cannot express the plan: {first_line(exc)}"
                )
                return None
            plan = Plan()
            plan.ParseFromString(produced)
            try:
                prepare_substrait(plan, logical)
            except NotDistributableError as exc:
                self._coordinator_only = str(exc)
                return None
            self._plan_bytes = plan.SerializeToString()
            try:
                self._coordinator_only = lost_in_substrait(ctx.ctx, logical, self._plan_bytes)
            except Exception as exc:  # DataFusion raises bare Exception
                self._coordinator_only = (
                    f"DataFusion cannot consume its own Substrait plan: {first_line(exc)}"
                )
        return self._plan_bytes

    def _planner_config(self) -> PlannerConfig:
        ctx = self.context
        session = SessionSettings.snapshot(ctx.functions, ctx.stores)
        return PlannerConfig.for_runtime(ctx.config, ctx.runtime, session)

    def _plan(
        self,
        config: PlannerConfig,
        materialized: dict[str, MaterializedStage] | None = None,
        query_id: str | None = None,
        first_stage_id: int = 1,
    ) -> StageGraph:
        """Plan the query (over the stages that ran, for adaptive execution).

        Raises:
            NotDistributableError: see :func:`plan_stages`.
        """
        plan = Plan()
        plan.ParseFromString(self._substrait())  # the planner rewrites its plan in place
        graph = plan_stages(
            plan, self.context.sources, config, materialized, query_id, first_stage_id
        )
        check_spark_reads(graph, self.context.runtime)
        return graph

    def _small_in_place(self) -> list[str] | None:
        """The tables of a query small enough to run in place, without planning; else None.

        A query whose scans of files and memory tables read at most
        ``in_place_bytes`` (uncompressed bytes of the columns they project;
        ``DistributedConfig.in_place_bytes``, else the runtime's
        ``RuntimeProfile.in_place_bytes``) runs as single-node DataFusion on
        the coordinator's context: no Substrait round trip, no planning, no
        task (the fixed cost of a small query is DataFusion's). Not when the
        config forces task counts, sizes or budgets (``tasks_per_stage``,
        ``bytes_per_task``, ``estimator``, ``memory_per_task_bytes``), for a
        write, nor when it reads a table only tasks can read (a feed, a Spark
        DataFrame). Decided once per DataFrame.

        Returns:
            The registered tables the query reads, or None.
        """
        if self._small is None:
            config = self.context.config
            sources = self.context.sources
            fits = (
                config.tasks_per_stage is None
                and config.bytes_per_task is None
                and config.estimator is None
                and config.memory_per_task_bytes is None
                and not writes(self.df)
            )
            read = scanned_bytes(self.df, sources) if sources and fits else {}
            limit = 0
            if fits:
                bound = config.in_place_bytes
                if bound is None:
                    bound = RuntimeProfile.of(self.context.runtime).in_place_bytes
                limit = bound
                fits = (
                    not any(sources[n].streamed for n in read)
                    and not any(n in self.context._not_on_coordinator for n in read)
                    and limit > 0
                    and sum(read.values()) <= limit
                )
            self._small = (fits, list(read), sum(read.values()), limit)
        in_place, tables, _, _ = self._small
        return tables if in_place else None

    def _in_place_df(self) -> DataFrame:
        """What a query run in place runs: its plan after the planner's join rules.

        Distributed runs plan over the rules of
        :func:`~distfusion.planner.plan.rewrite_joins` (semi joins pushed down,
        filtered dimensions joined first, eager aggregation, aggregate inputs
        reduced); they pay on one node too: at TPC-H SF1, single-node
        DataFusion runs Q17 and Q18 in about 55% of their time over the
        rewritten plans (docs/benchmarks.md, "Join rules in place"). The plan
        goes through Substrait to DataFusion's consumer on the coordinator's
        context, as a task's fragment does; that and the rules cost 5-15 ms,
        so ``self.df`` itself runs when the scans read less than
        ``in_place_rewrite_bytes`` (:class:`DistributedConfig`), when the
        rules change nothing, when Substrait cannot carry the query, or when
        the rewritten plan's schema differs. Decided once per DataFrame.
        """
        if self._in_place is None:
            self._in_place = self._rewritten() or self.df
        return self._in_place

    def _rewritten(self) -> DataFrame | None:
        """The query over the join rules' plan, or None (see :meth:`_in_place_df`)."""
        bound = self.context.config.in_place_rewrite_bytes
        assert self._small is not None  # _small_in_place decided first (its callers)
        _, _, nbytes, _ = self._small
        if bound is None or nbytes < bound:
            return None
        data = self._substrait()
        if data is None or self._coordinator_only is not None:
            return None
        plan = Plan()
        plan.ParseFromString(data)
        rewrite_joins(plan, self.context.sources, self._planner_config())
        rewritten = plan.SerializeToString()
        if rewritten == data or not fits_decoder(rewritten):
            return None
        ctx = self.context.ctx
        try:
            df = ctx.create_dataframe_from_logical_plan(consume_plan(ctx, rewritten))
        except Exception as exc:  # DataFusion's: the query runs unrewritten
            log.warning(
                "the rewritten plan is refused; running the query as planned: %s", first_line(exc)
            )
            return None
        return df if df.schema() == self.df.schema() else None

    def runs_in_place(self) -> str | None:
        """Why the query runs in place, or None when it is planned into stages.

        In place: single-node DataFusion on the coordinator, unplanned, because
        its scans read at most ``in_place_bytes`` (see
        :attr:`DistributedConfig.in_place_bytes`). :meth:`explain` then says
        so above the stages ``in_place_bytes=0`` would run, and
        :meth:`metrics` has no stage.

        Returns:
            A sentence with the bytes the scans read and the bound, or None.

        Raises:
            PlanningError: the runtime has no worker (its profile gives the bound).
        """
        if self._small_in_place() is None:
            return None
        assert self._small is not None  # set by _small_in_place
        _, _, nbytes, limit = self._small
        rules = ", its plan rewritten by the planner's join rules"
        return (
            f"its scans read {format_bytes(nbytes)} (uncompressed, the columns they project), "
            f"at most in_place_bytes ({format_bytes(limit)})"
            f"{rules if self._in_place_df() is not self.df else ''}"
        )

    def _start(self, query_id: str) -> tuple[Iterator[pa.RecordBatch], Callable]:
        """The result batches of a run as ``query_id`` (not started yet), and its final graph.

        Errors of planning are raised here, before any batch is asked for.
        """
        ctx = self.context
        self._ran = [
            scan.source.name
            for stage in self.stage_graph().stages
            for scan in stage.scans
            if scan.source.is_feed
        ]
        if runs_in_place(self.stage_graph(), ctx.config, ctx._not_on_coordinator):
            graph = dataclasses.replace(self.stage_graph(), query_id=query_id)
            scans = [(s.source, s.task_units[0]) for s in graph.head.scans]
            batches = run_in_place(self.df, query_id, scans, graph.head.stage_id)
            return batches, lambda: graph
        if not ctx.config.adaptive:
            graph = dataclasses.replace(self.stage_graph(), query_id=query_id)
            return named(ctx.runtime.execute(graph), self.df.schema()), lambda: graph
        config = self._planner_config()
        static = dataclasses.replace(self.stage_graph(), query_id=query_id)  # errors first

        def plan(materialized: dict[str, MaterializedStage], first_id: int) -> StageGraph:
            # Nothing ran yet: the static plan, planned once per DataFrame.
            if not materialized:
                return static
            return self._plan(config, materialized, query_id, first_id)

        report = self.last_run = AdaptiveReport()
        batches = run_adaptive(
            plan,
            ctx.runtime,
            query_id,
            config,
            ctx.config.adaptive_shuffle_bytes,
            report,
        )
        return named(batches, self.df.schema()), lambda: report.final if report.graphs else None

    def _prepare(self, run: QueryRun, query_id: str) -> StageGraph:
        """The graph to finish on ``run`` (query ``query_id``): adaptive waves run on it.

        For results that stay distributed: the caller runs the remaining
        stages and the head's parts on ``run`` (``map_head_parts``,
        ``head_parts``) and closes it.

        Raises:
            PlanningError, TaskError, TransportError: as :meth:`execute_stream`.
        """
        ctx = self.context
        static = dataclasses.replace(self.stage_graph(), query_id=query_id)  # errors first
        self._ran = [
            scan.source.name
            for stage in static.stages
            for scan in stage.scans
            if scan.source.is_feed
        ]
        if not ctx.config.adaptive:
            return static
        config = self._planner_config()

        def plan(materialized: dict[str, MaterializedStage], first_id: int) -> StageGraph:
            if not materialized:
                return static
            return self._plan(config, materialized, query_id, first_id)

        report = self.last_run = AdaptiveReport()
        return plan_final(plan, run, config, ctx.config.adaptive_shuffle_bytes, report)

    def _write_files(
        self, fmt: str, path: str | os.PathLike, partition_by: list[str] | None, mode: str
    ) -> list[WrittenFile]:
        """See :meth:`write_parquet`."""
        check_open(self.context.closed, self.context._runtime)
        if not self._is_query():
            msg = "the statement returns no columns (DDL): there is nothing to write"
            raise PlanningError(msg)
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        query_id = str(uuid.uuid4())
        path = os.fspath(path)
        self.context._stores_for(path)
        spec = WriteSpec(
            path if object_store.is_url(path) else os.path.abspath(path),
            query_id,
            fmt,
            self.schema(),
            tuple(partition_by or ()),
        )
        committer = FileCommitter(spec, mode)
        reason = self.coordinator_only()  # planned before anything is touched on disk
        if reason is not None:
            check_coordinator_reads(
                self.df, self.context.sources, reason, self.context._not_on_coordinator
            )
        committer.setup_job()
        try:
            return committer.commit_job(self._write_tasks(spec, reason))
        except BaseException:
            committer.abort_job()
            raise

    def _write_tasks(self, spec: WriteSpec, reason: str | None) -> list[list[WrittenFile]]:
        """Run the query as the tasks of ``spec``'s job (set up by the caller); their files.

        ``reason``: :meth:`coordinator_only`'s (checked by the caller): the
        query runs whole here, as one task. Used by :meth:`_write_files` and
        the table writes (:mod:`distfusion.delta_write`, :mod:`distfusion.io.iceberg.write`),
        which commit or abort the job.
        """
        if reason is not None:
            return [write_task(spec, 0, on_coordinator(self.df))]
        run = self.context.runtime.start_query(spec.query_id)
        try:
            graph = self._prepare(run, spec.query_id)
            graph = self._written_by_producer(run, graph)
            if isinstance(run, WritesHeadParts):
                return run.write_head_parts(graph, spec)
            # a run that cannot cut its head: the head whole, here
            return map_head_parts(run, graph, functools.partial(write_head_part, spec))
        finally:
            run.close()

    def _written_by_producer(self, run: QueryRun, graph: StageGraph) -> StageGraph:
        """``graph`` with its head fused into the stage producing its rows, where it can be.

        The producer's tasks then write (:mod:`distfusion.planner.write_from_producer`):
        no stage holds the whole result for the writers. Only for a run that
        writes or maps head parts where the data is (a head of several tasks
        cannot run whole here).
        """
        if not isinstance(run, (WritesHeadParts, MapsHeadParts)):
            return graph
        report = self.last_run if self.context.config.adaptive else None
        ran = set(report.stats) if report is not None else set()
        fused = write_from_producer(graph, ran)
        if fused is None:
            return graph
        if report is not None and report.graphs:
            report.graphs[-1] = fused
        return fused

    def _observed(
        self,
        observer: QueryObserver,
        batches: Iterator[pa.RecordBatch],
        final_graph: Callable[[], StageGraph | None],
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` with ``observer`` registered while they run; :meth:`metrics` after.

        Closing the returned iterator closes ``batches`` (which cancels the query).
        """
        start = time.perf_counter()
        try:
            with observing(observer):
                try:
                    for batch in batches:
                        observer.result_rows += batch.num_rows
                        yield batch
                finally:
                    close = getattr(batches, "close", None)
                    if close is not None:
                        close()
        finally:
            graph = final_graph()
            elapsed = time.perf_counter() - start
            started = self.context._runtime
            runtime = started.name if started is not None else "coordinator"
            if graph is None:
                graph = coordinator_graph(observer.query_id)
            self._metrics = build_query_metrics(
                graph, observer.tasks, observer.query_id, runtime, elapsed, observer.result_rows
            )

    def _run(self, progress: bool) -> tuple[Iterator[pa.RecordBatch], Callable[[], None]]:
        """A new run of the query: its batches, and what cancels it from another thread.

        See :meth:`~distfusion.context.DistributedDataFrame.execute_stream`.
        """
        check_open(self.context.closed, self.context._runtime)
        if not self._is_query():
            return iter(()), lambda: None
        if writes(self.df):
            self.context._written = True  # memory tables are read again before the next query
        # Every execution is a new query on the workers: a fresh id.
        query_id = str(uuid.uuid4())
        observer = QueryObserver(query_id, self.label)
        small = self._small_in_place()
        if small is not None:  # no planning: single-node DataFusion here
            if self.context.runtime.num_workers() < 1:  # a misconfigured cluster shows at once
                msg = "no workers: the worker resolver returned an empty list"
                raise PlanningError(msg)
            sources = self.context.sources
            scans = [(sources[n], sources[n].units) for n in small]
            batches = run_in_place(self._in_place_df(), query_id, scans, operators=False)
            stream = self._observed(observer, batches, lambda: None)
            stream = with_progress(stream, observer) if progress else stream
            return stream, observer.cancel
        reason = self.coordinator_only()
        if reason is not None:
            check_coordinator_reads(
                self.df, self.context.sources, reason, self.context._not_on_coordinator
            )
            stream = self._observed(observer, on_coordinator(self.df), lambda: None)
        else:
            stream = self._observed(observer, *self._start(query_id))
        stream = with_progress(stream, observer) if progress else stream
        return stream, observer.cancel
