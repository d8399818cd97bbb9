"""A query's work unit feed sessions, under their old import path.

They live in :mod:`distfusion.coordinator.feeds`; kept for the modules that
import them from here.
"""

from distfusion.coordinator.feeds import QueryFeeds, has_feeds

__all__ = ["QueryFeeds", "has_feeds"]
