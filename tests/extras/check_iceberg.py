"""``pip install 'distfusion[iceberg]'``: an Iceberg table (from its metadata file) read natively.

The table is written by the test (its catalog needs more than the extra);
here it is loaded as pyiceberg's ``StaticTable``. Usage:
``python check_iceberg.py WORK_DIR METADATA_LOCATION EXPECTED_ROWS``.
"""

import sys

from pyiceberg.table import StaticTable

from distfusion import DistributedContext, LocalRuntime

_work, metadata, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = DistributedContext(runtime=LocalRuntime(workers=2))
ctx.register_iceberg("t", StaticTable.from_metadata(metadata))
rows = ctx.sql("SELECT count(*) AS n, count(DISTINCT k) AS keys FROM t").to_pylist()
assert rows == [{"n": expected, "keys": 5}], rows
print("ok")
