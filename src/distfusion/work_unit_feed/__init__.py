"""Work unit feeds: leaf work discovered on the coordinator while the query runs.

- :class:`WorkUnit` (:mod:`.unit`): a serialisable description of source data.
- :class:`WorkUnitFeedProvider`, :class:`WorkUnitFeed`, :class:`FeedContext`,
  :class:`WorkSharingFeedProvider`, sessions and metrics (:mod:`.feed`): the
  coordinator side.
- :class:`FeedTableSource`, :class:`ListingFeed` (:mod:`.table`): feed-backed tables.

The worker side (a task's remote feed) is :mod:`distfusion.worker.feed_inbox`;
docs/work-unit-feeds.md draws how units travel on every runtime.
"""

from distfusion.work_unit_feed.feed import (
    FeedContext,
    FeedPartitionMetrics,
    WorkSharingFeedProvider,
    WorkUnitFeed,
    WorkUnitFeedProvider,
)
from distfusion.work_unit_feed.table import FeedTableSource, ListingFeed
from distfusion.work_unit_feed.unit import WorkUnit

__all__ = [
    "FeedContext",
    "FeedPartitionMetrics",
    "FeedTableSource",
    "ListingFeed",
    "WorkSharingFeedProvider",
    "WorkUnit",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
]
