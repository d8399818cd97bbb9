"""Partition pruning: the files of a directory-partitioned table that a read skips.

A table registered with ``table_partition_cols`` (Hive-style directories,
``dt=2024-01-01/``) knows each file's partition values before anything runs
(``WorkUnit.partition_values``). DataFusion pushes a query's filters into the
table scan (the Substrait ``ReadRel.filter``); the conjuncts that read only
partition columns are evaluated here, once per file, by DataFusion on the
coordinator, and the read keeps only the files that pass -- as DataFusion's
listing table and Spark's ``PartitioningAwareFileIndex`` prune directories.

The pruned read gets a table of its own (``<table>__pruned_<digest>``): two
reads of one table with different filters keep different files. Every filter
still runs in the tasks (the planner moves the read's filter above it), so
pruning only ever skips files whose rows the filter would drop.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pyarrow as pa
from datafusion import col
from substrait.proto import Rel

from distfusion.io.sources import TableSource, sql_name
from distfusion.substrait_plan.build import FunctionRegistry, conjuncts, field_ref, named_struct
from distfusion.substrait_plan.decode import consume_plan
from distfusion.substrait_plan.rewrite import SchemaOracle
from distfusion.substrait_plan.walk import field_refs, has_subquery

__all__ = ["prune_partitions", "pruned_read"]

UNIT_COLUMN = "__distfusion_unit"


def prune_partitions(
    rel: Rel, source: TableSource, registry: FunctionRegistry, oracle: SchemaOracle
) -> tuple[Rel, TableSource]:
    """``rel`` (a ``ReadRel`` of ``source``) reading only the files its partition filters keep.

    Returns ``(rel, source)`` unchanged when the table is not partitioned, the
    read has no conjunct on partition columns alone, or every file passes.
    Otherwise a copy of ``rel`` reading a new table, and that table: ``source``
    with the kept units only, named ``<name>__pruned_<digest of the kept
    paths>``, its options saying the original name (``table``) and unit count
    (``all_units``). The caller registers it with the planner and the oracle.

    Raises:
        Exception: DataFusion's error evaluating a condition (planning stops).
    """
    cols = source.options.get("partition_cols") or []
    read = rel.read
    if not cols or not source.units:
        return rel, source
    conds = []
    for name in ("filter", "best_effort_filter"):
        if read.HasField(name):
            conds.extend(conjuncts(getattr(read, name), registry))
    partition_fields = {source.schema.get_field_index(c) for c in cols}
    usable = [
        c
        for c in conds
        if field_refs(c) and field_refs(c) <= partition_fields and not has_subquery(c)
    ]
    if not usable:
        return rel, source
    keep = _passing_units(source, usable, oracle)
    if len(keep) == len(source.units):
        return rel, source
    return pruned_read(rel, source, tuple(source.units[i] for i in keep), "partitions pruned")


def pruned_read(rel: Rel, source: TableSource, units: tuple, how: str) -> tuple[Rel, TableSource]:
    """``rel`` reading a table of its own: ``source`` with only ``units`` (a subset of its units).

    The table is named ``<table>__pruned_<digest of the kept paths>``; its
    options say the registered name (``table``), the unit count before any
    pruning (``all_units``) and ``how`` they were pruned (``pruned``, shown
    by ``explain()``). Pruning a pruned read again keeps the first two.
    """
    table = source.options.get("table", source.name)
    digest = hashlib.sha1("\n".join(u.path for u in units).encode()).hexdigest()[:12]
    alias = f"{table}__pruned_{digest}"
    previous = source.options.get("pruned")
    options = {
        **source.options,
        "table": table,
        "all_units": source.options.get("all_units", len(source.units)),
        "pruned": how if previous is None or previous == how else f"{previous}, {how}",
    }
    pruned = dataclasses.replace(source, name=alias, units=units, options=options)
    out = Rel()
    out.CopyFrom(rel)
    del out.read.named_table.names[:]
    out.read.named_table.names.append(alias)
    return out, pruned


def _passing_units(source: TableSource, conditions: list, oracle: SchemaOracle) -> list[int]:
    """Indexes of ``source``'s units whose partition values pass every one of ``conditions``.

    One row per unit: the partition columns hold the unit's values cast to
    their types by DataFusion (as the tasks read them), the other columns
    nulls (no condition reads them), then the unit's index.
    """
    cols = source.options["partition_cols"]
    n = len(source.units)
    raw = {
        c: pa.array([u.partition_values[i] for u in source.units], pa.string())
        for i, c in enumerate(cols)
    }
    typed = oracle.ctx.from_arrow(pa.table(raw)).select(
        *[col(c).cast(source.schema.field(c).type).alias(c) for c in cols]
    )
    values = typed.to_arrow_table()
    arrays = [
        values.column(f.name).combine_chunks() if f.name in raw else pa.nulls(n, f.type)
        for f in source.schema
    ]
    arrays.append(pa.array(range(n), pa.int64()))
    # Positional, nullable columns, as ``named_struct`` declares them; the
    # conditions read fields by position.
    schema = pa.schema([pa.field(f"c{i}", a.type) for i, a in enumerate(arrays)])
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    table = f"__distfusion_partitions_{abs(hash(source.name))}"
    oracle.ctx.register_record_batches(sql_name(table), [[batch]])
    try:
        cur = Rel()
        cur.read.base_schema.CopyFrom(named_struct(schema))
        cur.read.named_table.names.append(table)
        for cond in conditions:  # one filter each: no AND function anchor needed
            f = Rel()
            f.filter.input.CopyFrom(cur)
            f.filter.condition.CopyFrom(cond)
            cur = f
        p = Rel()
        p.project.input.CopyFrom(cur)
        p.project.expressions.append(field_ref(len(source.schema)))
        p.project.common.emit.output_mapping.append(len(schema))
        lp = consume_plan(oracle.ctx, oracle.plan_bytes(p, [UNIT_COLUMN]))
        out = oracle.ctx.create_dataframe_from_logical_plan(lp).to_arrow_table()
    finally:
        oracle.ctx.deregister_table(sql_name(table))
    return sorted(out.column(0).to_pylist())
