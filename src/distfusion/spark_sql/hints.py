"""Spark SQL hints: join strategy hints carried to the planner, the others accepted.

Spark reads ``/*+ ... */`` after ``SELECT`` (``hintStatements`` of its
grammar). Join strategy hints name relations of the query block they are
written in; the named relation's joins then use the strategy where the join
allows it. Spark's rules, followed here:

- the names: ``BROADCAST``, ``BROADCASTJOIN``, ``MAPJOIN`` (broadcast the
  relation); ``MERGE``, ``SHUFFLE_MERGE``, ``MERGEJOIN`` (a sort-merge join:
  both sides shuffled); ``SHUFFLE_HASH`` (a shuffled hash join: both sides
  shuffled); ``SHUFFLE_REPLICATE_NL`` (a cartesian product; distfusion has
  nothing else for a join without keys that it does not broadcast, so it
  changes nothing here);
- a parameter names a relation of the block by its alias when it has one,
  else by its table (or CTE) name, case-insensitively; a qualified name
  ``db.t`` must match the end of the table's own qualified name. Relations
  inside a derived table or a CTE are another block's (Spark's
  ``ResolveJoinStrategyHints`` does not descend below a ``SubqueryAlias``),
  but a relation of a parenthesised join is this block's;
- a strategy hint without parameters hints the block itself: as a derived
  table or a CTE its joins in the enclosing block follow it;
- two strategies for one relation: the first written wins (Spark logs
  "hint overridden");
- a hint naming no relation, an unknown hint, and the partitioning hints
  (``REPARTITION``, ``REPARTITION_BY_RANGE``, ``COALESCE``, ``REBALANCE``)
  change no plan: they are dropped (Spark checks their parameters when it
  analyzes the query, which ``distfusion.spark.sql`` asks it to do first).

A hinted relation ``r AS x`` is written as ``(SELECT * FROM r AS <marker>)
AS x``: the marker alias (:data:`HINT_ALIAS_PREFIX` and the strategy) is a
``SubqueryAlias`` of DataFusion's logical plan, where the planner finds it
(:mod:`distfusion.planner.join_hints`); the query's columns and answers do
not change. Which join a hint reaches, and whether the join type allows the
strategy (Spark ignores ``BROADCAST`` of the preserved side of an outer
join), the planner decides.
"""

from __future__ import annotations

from typing import TypeVar

from sqlglot import exp

__all__ = [
    "BROADCAST",
    "HINT_ALIAS_PREFIX",
    "JOIN_STRATEGIES",
    "MERGE",
    "SHUFFLE_HASH",
    "SHUFFLE_REPLICATE_NL",
    "apply_hints",
]

BROADCAST = "broadcast"
MERGE = "merge"
SHUFFLE_HASH = "shuffle_hash"
SHUFFLE_REPLICATE_NL = "shuffle_replicate_nl"

JOIN_STRATEGIES = {
    "BROADCAST": BROADCAST,
    "BROADCASTJOIN": BROADCAST,
    "MAPJOIN": BROADCAST,
    "MERGE": MERGE,
    "SHUFFLE_MERGE": MERGE,
    "MERGEJOIN": MERGE,
    "SHUFFLE_HASH": SHUFFLE_HASH,
    "SHUFFLE_REPLICATE_NL": SHUFFLE_REPLICATE_NL,
}
"""Spark's join strategy hint names (``JoinStrategyHint.strategies``) -> strategy."""

HINT_ALIAS_PREFIX = "__distfusion_hint_"
"""The alias of a hinted relation's marker is this prefix and its strategy."""

# The arguments a relation may have for its wrapping to keep its meaning.
_PLAIN: dict[type[exp.Expr], set[str]] = {
    exp.Table: {"this", "db", "catalog", "alias"},
    exp.Subquery: {"this", "alias"},
}

Q = TypeVar("Q", bound=exp.Expr)  # apply_hints gives back what it is given


def apply_hints(ast: Q) -> Q:
    """``ast`` without hints, its join-hinted relations wrapped in marker aliases.

    Called by :func:`~distfusion.spark_sql.translate.parse` on sqlglot's
    tree of a Spark SQL query, before its columns are resolved. Modifies
    ``ast`` in place and returns it.
    """
    strategies: dict[int, tuple[exp.Expr, str]] = {}
    for select in list(ast.find_all(exp.Select)):  # breadth first: outer blocks first
        hint = select.args.get("hint")
        if hint is None:
            continue
        hint.pop()
        if not _reaches_a_join(select):
            continue
        for entry in hint.expressions:
            strategy = JOIN_STRATEGIES.get(_hint_name(entry))
            if strategy is None:
                continue  # a partitioning hint, or one Spark does not know
            names = [_name_parts(a) for a in entry.expressions]
            if not names:  # the block itself
                parent = select.parent
                if isinstance(parent, exp.Subquery) and parent.alias and _is_relation(parent):
                    strategies.setdefault(id(parent), (parent, strategy))
                elif isinstance(parent, exp.CTE):
                    _hint_cte_references(ast, parent.alias_or_name, strategy, strategies)
                continue
            for relation in _relations(select):
                ident = _identifier(relation)
                if any(n and _matches(n, ident) for n in names):
                    strategies.setdefault(id(relation), (relation, strategy))
    for relation, strategy in strategies.values():
        _wrap(relation, strategy)
    return ast


def _hint_name(entry: exp.Expr) -> str:
    if isinstance(entry, exp.JoinHint | exp.Anonymous):
        return str(entry.this).upper()
    return entry.name.upper() if isinstance(entry, exp.Var) else ""


def _name_parts(arg: exp.Expr) -> list[str]:
    """A hint parameter's name, lower case, qualifiers first; [] for a non-name."""
    if isinstance(arg, exp.Table | exp.Column):
        return [p.name.lower() for p in arg.parts]
    if isinstance(arg, exp.Identifier | exp.Var):
        return [arg.name.lower()]
    return []


def _is_relation(node: exp.Expr) -> bool:
    return isinstance(node.parent, exp.From | exp.Join)


def _reaches_a_join(select: exp.Select) -> bool:
    """Whether a hint of ``select`` can reach a join: one of its own, or the enclosing block's.

    A block read as a derived table or a CTE passes its hinted relations up
    to the join reading it (through Spark's unary operators); one inside an
    ``IN``, ``EXISTS`` or scalar subquery reaches none when it has no join
    of its own (Spark drops such a hint before the subquery becomes a join).
    """
    if select.args.get("joins") or any(isinstance(r.parent, exp.Join) for r in _relations(select)):
        return True
    node: exp.Expr = select
    while isinstance(node.parent, exp.Union | exp.Subquery):
        node = node.parent
    return isinstance(node.parent, exp.CTE) or (
        isinstance(node, exp.Subquery) and _is_relation(node)
    )


def _relations(select: exp.Select) -> list[exp.Expr]:
    """The relations of ``select``'s own block: its FROM and JOINs, into parenthesised joins."""
    found: list[exp.Expr] = []
    tops = []
    if select.args.get("from_") is not None:
        tops.append(select.args["from_"].this)
    elif select.args.get("from") is not None:
        tops.append(select.args["from"].this)
    tops += [j.this for j in select.args.get("joins") or []]
    while tops:
        node = tops.pop(0)
        if (
            isinstance(node, exp.Subquery)
            and not node.alias
            and not isinstance(node.this, exp.Query)
        ):
            tops.insert(0, node.this)  # ``(a JOIN b)``: a and b are this block's
            continue
        inner = node.args.get("joins") or []
        found.append(node)
        tops += [j.this for j in inner]
    return found


def _identifier(relation: exp.Expr) -> list[str]:
    """A relation's name in its block, lower case: its alias, else its qualified table name."""
    if relation.alias:
        return [relation.alias.lower()]
    if isinstance(relation, exp.Table):
        return [p.name.lower() for p in relation.parts]
    return []


def _matches(hint: list[str], ident: list[str]) -> bool:
    """Spark's ``matchedIdentifier``: the hint's parts are the last parts of the relation's."""
    return 0 < len(hint) <= len(ident) and ident[-len(hint) :] == hint


def _hint_cte_references(ast: exp.Expr, name: str, strategy: str, strategies: dict) -> None:
    """Hint every relation reading CTE ``name`` (a parameterless hint in its body)."""
    for table in ast.find_all(exp.Table):
        if _is_relation(table) and not table.db and table.name.lower() == name.lower():
            strategies.setdefault(id(table), (table, strategy))


def _wrap(relation: exp.Expr, strategy: str) -> None:
    """Write ``relation AS x`` as ``(SELECT * FROM relation AS <marker>) AS x``.

    A relation with more than a name and an alias (a sample, a pivot,
    joins of its own) is left as it is: the hint is then not followed.
    """
    plain = _PLAIN.get(type(relation))
    if plain is None or any(v for k, v in relation.args.items() if k not in plain):
        return
    parent, key, index = relation.parent, relation.arg_key, relation.index
    outer = relation.args.get("alias")
    if outer is None:
        if not isinstance(relation, exp.Table):
            return
        outer = exp.TableAlias(this=exp.to_identifier(relation.name))
    else:
        outer.pop()
    relation.set("alias", exp.TableAlias(this=exp.to_identifier(HINT_ALIAS_PREFIX + strategy)))
    wrapper = exp.Subquery(this=exp.select("*").from_(relation, copy=False), alias=outer)
    assert parent is not None and key is not None  # a relation: a FROM's or a JOIN's
    parent.set(key, wrapper, index)
