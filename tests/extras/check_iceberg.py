"""``pip install 'distfusion[iceberg]'``: an Iceberg table (from its metadata file) read natively.

The table is written by the test (its catalog needs more than the extra);
here it is loaded as pyiceberg's ``StaticTable``. Writing a table partitioned
by ``day(ts)`` or ``month(ts)`` computes each row's partition with the
transform's ``pyarrow_transform``, which needs ``pyiceberg-core``: the extra
brings it (issue 41, item 14), checked here on the transforms themselves
(appending needs a catalog, and pyiceberg's catalogs need more than the extra).
Usage: ``python check_iceberg.py WORK_DIR METADATA_LOCATION EXPECTED_ROWS``.
"""

import datetime
import sys

import pyarrow as pa
from pyiceberg.table import StaticTable
from pyiceberg.transforms import DayTransform, MonthTransform
from pyiceberg.types import TimestampType

from distfusion import DistributedContext, LocalRuntime

_work, metadata, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = DistributedContext(runtime=LocalRuntime(workers=2))
ctx.register_iceberg("t", StaticTable.from_metadata(metadata))
rows = ctx.sql("SELECT count(*) AS n, count(DISTINCT k) AS keys FROM t").to_pylist()
assert rows == [{"n": expected, "keys": 5}], rows

stamps = pa.array(
    [datetime.datetime(1970, 1, 2, 3), datetime.datetime(2024, 3, 15)], pa.timestamp("us")
)
days = DayTransform().pyarrow_transform(TimestampType())(stamps)  # what append() calls per row
months = MonthTransform().pyarrow_transform(TimestampType())(stamps)
assert days.to_pylist() == [1, 19797], days  # days since 1970-01-01
assert months.to_pylist() == [0, 650], months  # months since 1970-01
print("ok")
