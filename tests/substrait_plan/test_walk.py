"""The relation walker (:mod:`distfusion.substrait_plan.walk`) on DataFusion's own plans."""

from __future__ import annotations

from substrait.proto import Rel

from distfusion.substrait_plan.walk import (
    children,
    contains,
    field_refs,
    is_subquery,
    own_subqueries,
    rel_kind,
    relations,
    set_children,
    source_tables,
    walk,
)
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
