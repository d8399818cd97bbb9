"""The relation walker (:mod:`distfusion.substrait_plan.walk`) on DataFusion's own plans."""

from __future__ import annotations

import pytest
from substrait.proto import Expression, Rel

from distfusion.substrait_plan.walk import (
    children,
    contains,
    field_refs,
    find,
    is_subquery,
    own_subqueries,
    read_rels,
    rel_kind,
    relations,
    set_children,
    source_tables,
    walk,
)
from distfusion.tpch import query
from tests.planner.helpers import consumed, substrait_of

SUBQUERY = "SELECT k FROM t WHERE v > (SELECT avg(k) FROM u) ORDER BY k"


def root(plan) -> Rel:
    return plan.relations[0].root.input


def test_relations_pre_order_not_into_subqueries(ctx):
    plan, _ = substrait_of(ctx, SUBQUERY)
    kinds = [rel_kind(r) for r in relations(root(plan))]
    assert kinds[0] == "sort" and kinds[-1] == "read"
    assert [
        r.read.named_table.names[-1] for r in relations(root(plan)) if rel_kind(r) == "read"
    ] == ["t"]
    # walk goes everywhere, subquery expressions included
    reads = [m for m in walk(plan) if isinstance(m, Rel) and rel_kind(m) == "read"]
    assert sorted(r.read.named_table.names[-1] for r in reads) == ["t", "u"]
    assert source_tables(root(plan), {"t", "u"}) == ["t", "u"]
    assert contains(root(plan), is_subquery)


def test_own_subqueries_are_the_relations_own(ctx):
    plan, _ = substrait_of(ctx, SUBQUERY)
    holders = [r for r in relations(root(plan)) if own_subqueries(r)]
    assert [rel_kind(r) for r in holders] == ["filter"]


def test_set_children_replaces_inputs_and_keeps_the_original(ctx):
    plan, _ = substrait_of(ctx, "SELECT t.k, u.w FROM t JOIN u ON t.k = u.k")
    (join,) = [r for r in relations(root(plan)) if rel_kind(r) == "join"]
    left, right = children(join)
    swapped = set_children(join, [right, left])
    assert children(swapped)[0] == right and children(join)[0] == left
    # a leaf has no input, and walking it stops there
    assert children(left) == [] or rel_kind(children(left)[0]) == "read"


def test_field_refs_of_a_filter_condition(ctx):
    plan, _ = substrait_of(ctx, "SELECT k FROM t WHERE v > 2 AND s = 'b'")
    (read,) = [r for r in relations(root(plan)) if rel_kind(r) == "read"]
    conditions = [read.read.filter] if read.read.HasField("filter") else []
    conditions += [r.filter.condition for r in relations(root(plan)) if rel_kind(r) == "filter"]
    assert set().union(*(field_refs(c) for c in conditions)) == {1, 2}  # v and s of t(k, v, s)
    assert consumed(ctx, plan).startswith("Projection: t.k")


WINDOW = (
    "SELECT l_orderkey, rank() OVER (PARTITION BY l_suppkey ORDER BY l_quantity) AS r "
    "FROM lineitem WHERE l_quantity > (SELECT avg(l_quantity) FROM lineitem)"
)


@pytest.mark.parametrize("target", [Rel, Expression.Subquery, Expression.WindowFunction])
def test_find_yields_what_walk_yields(oracle, target):
    """``find`` skips only fields that cannot hold ``target``: same messages, same order.

    Over TPC-H's queries (Q15 is a view and three statements) and one with a
    window function.
    """
    found = 0
    for sql in [query(q) for q in range(1, 23) if q != 15] + [WINDOW]:
        plan, _ = substrait_of(oracle, sql)
        expected = [m for m in walk(plan) if isinstance(m, target)]
        assert list(find(plan, target)) == expected, sql
        outermost = walk(plan, stop=lambda m: isinstance(m, target))
        expected_outermost = [m for m in outermost if isinstance(m, target)]
        assert list(find(plan, target, outermost=True)) == expected_outermost, sql
        found += len(expected)
        if target is Rel:
            assert list(read_rels(plan)) == [m for m in expected if rel_kind(m) == "read"]
    assert found > 0
