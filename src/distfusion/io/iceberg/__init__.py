"""Iceberg tables read by distfusion: planned on the coordinator while the query runs.

``ctx.register_iceberg(name, table)`` (a pyiceberg ``Table`` from any catalog)
registers an :class:`IcebergTable`, a feed-backed table
(:mod:`distfusion.work_unit_feed`):

- :mod:`.plan_files` (coordinator): scan planning with pyiceberg's own
  evaluators and manifest readers, one manifest at a time, a work unit per
  data file streamed to the leaf tasks as soon as its manifest is read;
- :mod:`.filters`: the query's pushed-down filters as a pyiceberg expression;
- :mod:`.read_files` (tasks): data files read natively by DataFusion,
  columns matched by Iceberg field id, position deletes applied;
- :mod:`.stores`: the object store of the table's location, from its FileIO.

pyiceberg is needed on the coordinator only (``pip install 'distfusion[iceberg]'``).
docs/iceberg.md has an example.
"""

from distfusion.io.iceberg.plan_files import ScanReport
from distfusion.io.iceberg.table import IcebergTable

__all__ = ["IcebergTable", "ScanReport"]
