"""File skipping by statistics (:mod:`distfusion.planner.skip_units`).

Three Parquet files of k 0..9, 10..19 and 20..29, registered as a distfusion
source; the per-unit statistics a lakehouse log would give are read from the
files' own footers. :func:`skip_units` is called on the ``ReadRel`` that
DataFusion's producer writes for a query, with the predicates
:func:`~distfusion.planner.scan_filters.scan_filters` finds in it.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distfusion import DistributedContext, LocalRuntime
from distfusion.planner.scan_filters import scan_filters
from distfusion.planner.skip_units import skip_units
from distfusion.substrait_plan.build import FunctionRegistry
from distfusion.substrait_plan.walk import relations
from tests.planner.helpers import substrait_of


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("units")
    for i in range(3):
        k = pa.array(range(10 * i, 10 * i + 10), pa.int64())
        s = pa.array([None] * 10 if i == 2 else [f"s{i}"] * 10, pa.string())
        pq.write_table(pa.table({"k": k, "s": s}), root / f"part-{i}.parquet")
    with DistributedContext(runtime=LocalRuntime(workers=1)) as ctx:
        ctx.register_parquet("t", str(root))
        yield ctx


def with_footer_stats(ctx):
    """The registered source of t, with each file's min, max and null count per column."""
    source = ctx.sources["t"]
    stats = {}
    for unit in source.units:
        meta = pq.ParquetFile(unit.path).metadata.row_group(0)
        cols = {}
        for c in range(meta.num_columns):
            st = meta.column(c).statistics
            cols[meta.column(c).path_in_schema] = (
                st.min if st.has_min_max else None,
                st.max if st.has_min_max else None,
                st.null_count,
            )
        stats[unit.path] = cols
    return dataclasses.replace(source, unit_stats=stats)


def skipped(ctx, sql: str, source):
    """(kept unit file names, pruned-table options) after skip_units on ``sql``'s read of t."""
    plan, _ = substrait_of(ctx.ctx, sql)
    (read,) = [
        r for r in relations(plan.relations[0].root.input) if r.WhichOneof("rel_type") == "read"
    ]
    filters = scan_filters(read.read, FunctionRegistry(plan))
    rel, out = skip_units(read, source, filters)
    names = sorted(u.path.rsplit("/", 1)[-1] for u in out.units)
    if out is source:
        assert rel is read
        return names, None
    assert list(rel.read.named_table.names) == [out.name]
    return names, (out.name.startswith("t__pruned_"), out.options["pruned"])


def test_a_range_skips_the_files_whose_bounds_rule_it_out(ctx):
    source = with_footer_stats(ctx)
    got = skipped(ctx, "SELECT k FROM t WHERE k > 15", source)
    assert got == (["part-1.parquet", "part-2.parquet"], (True, "skipped by statistics"))
    got = skipped(ctx, "SELECT k FROM t WHERE k = 3 OR k = 27", source)
    assert got == (["part-0.parquet", "part-2.parquet"], (True, "skipped by statistics"))


def test_null_counts_decide_is_null(ctx):
    source = with_footer_stats(ctx)
    assert skipped(ctx, "SELECT k FROM t WHERE s IS NULL", source)[0] == ["part-2.parquet"]
    got = skipped(ctx, "SELECT k FROM t WHERE s = 's1'", source)[0]
    assert got == ["part-1.parquet"]  # part-2's s is all NULL: no row equals anything


def test_nothing_skipped_without_statistics_or_when_every_file_might_match(ctx):
    plain = ctx.sources["t"]
    assert skipped(ctx, "SELECT k FROM t WHERE k > 15", plain) == (
        ["part-0.parquet", "part-1.parquet", "part-2.parquet"],
        None,
    )
    source = with_footer_stats(ctx)
    assert skipped(ctx, "SELECT k FROM t WHERE k >= 0", source)[1] is None
    assert skipped(ctx, "SELECT k FROM t", source)[1] is None
