"""Split an aggregate into a partial aggregate and a final aggregate.

```
  Aggregate(keys; sum(x), avg(y), count(*))            single node
=>
  Project(keys, CAST(s AS sum type),                    final, after the shuffle
          CAST(sy / cy AS avg type),            decimal: decimal / int64
          CAST(c AS count type))                (else both as double)
    Aggregate(c0..ck; sum(s), sum(sy), sum(cy), sum(c))
      <- shuffle by c0..ck
  Aggregate(keys; s = sum(x), sy = sum(y), cy = count(y), c = count(*))   partial
```

Decomposable functions (as in Spark's partial aggregation): ``sum``, ``count``,
``min``, ``max``, ``avg`` (as sum and count), ``bool_and``, ``bool_or``, and a
Python aggregate UDF declared mergeable (``distfusion.udaf(..., mergeable=True)``)
as its two companions: ``name__partial`` (the accumulator's state as one struct
column) below the shuffle, ``name__final`` (merges the states) above it, see
:mod:`distfusion.udfs`. A measure with ``DISTINCT`` or an ordering, or any other
function (an aggregate UDF not declared mergeable included), makes the whole
aggregate non-decomposable; the planner then shuffles raw rows instead.

A decimal average divides the exact decimal sum by the count in decimal
arithmetic, which is what DataFusion's own ``avg`` does (``DecimalAverager``):
the sum of scale ``s`` divided by an integer is Arrow's decimal division, of
scale ``min(s + 4, max scale)``, truncated toward zero, the scale of
DataFusion's average type ``Decimal(min(p + 4, max), min(s + 4, max))``. The final
cast only narrows the precision (and fails, as DataFusion does, on overflow), so a
decimal average equals single-node DataFusion's exactly. Other averages (float64)
divide the sums as float64.
"""

from __future__ import annotations

from dataclasses import dataclass

from substrait.proto import AggregateFunction, AggregateRel, NamedStruct, Rel, Type

from distfusion.substrait_plan.build import FunctionRegistry, cast, field_ref
from distfusion.udfs import Functions

__all__ = ["grouping_count", "is_decomposable", "split_aggregate"]

_SAME = {"min": "min", "max": "max", "bool_and": "bool_and", "bool_or": "bool_or"}
_DECOMPOSABLE = {"sum", "count", "avg", *_SAME}
# Substrait type kinds of decimals (Decimal128 and Decimal256 both map to ``decimal``).
_DECIMAL_KINDS = {"decimal"}


def grouping_count(agg: AggregateRel) -> int:
    """Number of grouping key columns the aggregate outputs before its measures."""
    return len(agg.grouping_expressions)


def is_decomposable(
    agg: AggregateRel, registry: FunctionRegistry, functions: Functions | None = None
) -> bool:
    """True if every measure can run as partial + final (see module docs).

    ``functions``: the query's Python UDFs (a mergeable UDAF decomposes); None: none.
    """
    if len(agg.groupings) > 1:  # grouping sets: run once, after a coalesce
        return False
    for m in agg.measures:
        f = m.measure
        name = registry.name(f.function_reference)
        if name not in _DECOMPOSABLE and _merge(functions, name) is None:
            return False
        if f.invocation == AggregateFunction.AGGREGATION_INVOCATION_DISTINCT or len(f.sorts):
            return False
    return True


@dataclass(frozen=True)
class SplitAggregate:
    """The two halves of a decomposed aggregate.

    Attributes:
        partial: the partial aggregate over the original input; outputs the
            grouping keys then the partial states.
        final: builds the final aggregate over a stage-input ``Rel`` whose columns
            are the partial's output; its output columns equal the original
            aggregate's.
        num_keys: grouping key columns (the shuffle keys are columns ``0..num_keys-1``).
    """

    partial: Rel
    num_keys: int
    final_measures: list  # (function name, partial column) per final measure
    outputs: list  # how each original measure is rebuilt from final measures


def _merge(functions: Functions | None, name: str) -> tuple[str, str] | None:
    return None if functions is None else functions.merge_functions(name)


def split_aggregate(
    agg_rel: Rel, registry: FunctionRegistry, functions: Functions | None = None
) -> SplitAggregate:
    """Build the partial aggregate of ``agg_rel`` (decomposable with ``functions``)."""
    agg = agg_rel.aggregate
    g = grouping_count(agg)
    partial = Rel()
    partial.aggregate.CopyFrom(agg)
    partial.aggregate.ClearField("common")  # the partial outputs all its columns
    del partial.aggregate.measures[:]
    final_measures: list[tuple[str, int]] = []
    outputs: list[tuple] = []

    def add_partial(func: AggregateFunction, filt) -> int:
        m = partial.aggregate.measures.add()
        m.measure.CopyFrom(func)
        if filt is not None:
            m.filter.CopyFrom(filt)
        return g + len(partial.aggregate.measures) - 1

    for measure in agg.measures:
        f = measure.measure
        filt = measure.filter if measure.HasField("filter") else None
        name = registry.name(f.function_reference)
        merge = _merge(functions, name)
        if merge is not None:  # a mergeable Python UDAF: its state crosses the network
            p = AggregateFunction()
            p.CopyFrom(f)
            p.function_reference = registry.anchor(merge[0])
            final_measures.append((merge[1], add_partial(p, filt)))
            outputs.append(("cast", len(final_measures) - 1))
        elif name == "avg":
            s = AggregateFunction()
            s.CopyFrom(f)
            s.function_reference = registry.anchor("sum")
            c = AggregateFunction()
            c.CopyFrom(f)
            c.function_reference = registry.anchor("count")
            final_measures.append(("sum", add_partial(s, filt)))
            final_measures.append(("sum", add_partial(c, filt)))
            outputs.append(("avg", len(final_measures) - 2, len(final_measures) - 1))
        else:
            col = add_partial(f, filt)
            final_measures.append((_SAME.get(name, "sum"), col))
            outputs.append(("cast", len(final_measures) - 1))
    return SplitAggregate(partial, g, final_measures, outputs)


def final_aggregate(
    split: SplitAggregate,
    stage_input: Rel,
    output_schema: NamedStruct,
    original: AggregateRel,
    registry: FunctionRegistry,
) -> Rel:
    """The final aggregate over ``stage_input`` plus a projection restoring types.

    ``output_schema`` is the original aggregate's output schema (its measure types
    are the cast targets). The result outputs exactly the original's columns, in
    order, so parent references stay valid.
    """
    g = split.num_keys
    fin = Rel()
    fin.aggregate.input.CopyFrom(stage_input)
    for i in range(g):
        fin.aggregate.grouping_expressions.append(field_ref(i))
    grouping = fin.aggregate.groupings.add()
    grouping.expression_references.extend(range(g))
    for func_name, col in split.final_measures:
        fin.aggregate.measures.add().measure.CopyFrom(registry.aggregate(func_name, field_ref(col)))

    types = output_schema.struct.types
    fp64 = Type(fp64=Type.FP64(nullability=Type.NULLABILITY_NULLABLE))
    proj = Rel()
    proj.project.input.CopyFrom(fin)
    width = g + len(split.final_measures)
    for i, out in enumerate(split.outputs):
        target = types[g + i]
        if out[0] == "avg":
            s, c = field_ref(g + out[1]), field_ref(g + out[2])
            if target.WhichOneof("kind") in _DECIMAL_KINDS:
                # decimal / int64: Arrow's decimal division at scale s + 4, truncated
                expr = registry.call("divide", s, c, output_type=target)
            else:
                expr = registry.call("divide", cast(s, fp64), cast(c, fp64), output_type=fp64)
        else:
            expr = field_ref(g + out[1])
        proj.project.expressions.append(cast(expr, target))
    mapping = proj.project.common.emit.output_mapping
    mapping.extend(range(g))
    mapping.extend(range(width, width + len(split.outputs)))
    if original.HasField("common") and original.common.HasField("emit"):
        # the original's own emit applies on top of keys + measures
        outer = Rel()
        outer.project.input.CopyFrom(proj)
        outer.project.common.emit.output_mapping.extend(original.common.emit.output_mapping)
        return outer
    return proj
