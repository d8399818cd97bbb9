"""distfusion: distributed SQL for Python on Apache DataFusion.

A query is planned once on a coordinator, cut into stages at network
boundaries (shuffle, coalesce, broadcast) and run as tasks on workers, each
executing its Substrait fragment natively with DataFusion. The map of the
code is docs/architecture.md.
"""

# First, before DataFusion and pyarrow load: sets how long mimalloc keeps freed memory.
import distfusion.allocator  # noqa: F401
from distfusion.context import DistributedConfig, DistributedContext, DistributedDataFrame
from distfusion.coordinator.query_run import Runtime
from distfusion.errors import (
    AuthenticationError,
    ContextClosedError,
    DistfusionError,
    FeedError,
    PlanningError,
    QueryCancelled,
    QueryCancelledError,
    SparkSemanticsError,
    TaskError,
    TaskPanicked,
    TransientError,
    TransportError,
    WorkerUnavailableError,
)
from distfusion.metrics import (
    BoundaryMetrics,
    Distribution,
    OperatorMetrics,
    Progress,
    QueryMetrics,
    StageMetrics,
    TaskMetrics,
)
from distfusion.planner.config import RuntimeProfile
from distfusion.planner.estimate import DefaultTaskEstimator, TaskEstimator
from distfusion.runtime.flight import FlightRuntime
from distfusion.runtime.local import LocalRuntime
from distfusion.runtime.resolver import (
    DynamicWorkerResolver,
    SparkWorkerResolver,
    StaticWorkerResolver,
    WorkerResolver,
)
from distfusion.runtime.spark import SparkRuntime
from distfusion.stages import StageGraph
from distfusion.table_write import DeltaDirectoryCatalog, TableCommit, TableWriteError
from distfusion.transport.base import WorkerTransport
from distfusion.transport.in_memory import InMemoryTransport
from distfusion.udfs import udaf, udf, udwf
from distfusion.work_unit_feed import (
    FeedContext,
    FeedPartitionMetrics,
    FeedTableSource,
    ListingFeed,
    WorkSharingFeedProvider,
    WorkUnit,
    WorkUnitFeed,
    WorkUnitFeedProvider,
)

__all__ = [
    "AuthenticationError",
    "BoundaryMetrics",
    "ContextClosedError",
    "DefaultTaskEstimator",
    "DeltaDirectoryCatalog",
    "DistfusionError",
    "DistributedConfig",
    "DistributedContext",
    "DistributedDataFrame",
    "Distribution",
    "DynamicWorkerResolver",
    "FeedContext",
    "FeedError",
    "FeedPartitionMetrics",
    "FeedTableSource",
    "FlightRuntime",
    "InMemoryTransport",
    "ListingFeed",
    "LocalRuntime",
    "OperatorMetrics",
    "PlanningError",
    "Progress",
    "QueryCancelled",
    "QueryCancelledError",
    "QueryMetrics",
    "Runtime",
    "RuntimeProfile",
    "SparkRuntime",
    "SparkSemanticsError",
    "SparkWorkerResolver",
    "StageGraph",
    "StageMetrics",
    "StaticWorkerResolver",
    "TableCommit",
    "TableWriteError",
    "TaskError",
    "TaskEstimator",
    "TaskMetrics",
    "TaskPanicked",
    "TransientError",
    "TransportError",
    "WorkSharingFeedProvider",
    "WorkUnit",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "WorkerResolver",
    "WorkerTransport",
    "WorkerUnavailableError",
    "udaf",
    "udf",
    "udwf",
]

__version__ = "0.1.0"
