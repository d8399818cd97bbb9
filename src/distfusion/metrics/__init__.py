"""Observability: what a distributed query did, measured on every runtime.

- :mod:`~distfusion.metrics.task`: :class:`TaskMetrics` measured where a task
  runs (rows, bytes, seconds, DataFusion's operator metrics);
- :mod:`~distfusion.metrics.query`: :class:`QueryMetrics` of a run, per stage
  (sums and skew) and per network boundary;
- :mod:`~distfusion.metrics.observer`: the coordinator's view of a running
  query (metrics as they come back, progress);
- :mod:`~distfusion.metrics.render`: EXPLAIN ANALYZE text, Graphviz DOT, HTML.

See docs/observability.md.
"""

from distfusion.metrics.observer import Progress, QueryObserver, observer_for, observing
from distfusion.metrics.query import (
    BoundaryMetrics,
    Distribution,
    QueryMetrics,
    StageMetrics,
    build_query_metrics,
)
from distfusion.metrics.task import OperatorMetrics, TaskMeter, TaskMetrics, operator_metrics

__all__ = [
    "BoundaryMetrics",
    "Distribution",
    "OperatorMetrics",
    "Progress",
    "QueryMetrics",
    "QueryObserver",
    "StageMetrics",
    "TaskMeter",
    "TaskMetrics",
    "build_query_metrics",
    "observer_for",
    "observing",
    "operator_metrics",
]
