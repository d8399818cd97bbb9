"""Rules for structs and maps: Spark's constructors and accessors as DataFusion's functions.

``named_struct``, ``struct``, field access (``s.a``, ``s['a']``), ``map``,
``m[k]``, ``element_at(m, k)``, ``map_keys``, ``map_values``,
``map_from_arrays``, ``map_contains_key``, ``size`` / ``cardinality`` of a
map. Each becomes DataFusion's function of the same meaning
(``named_struct``, ``get_field``, ``map``, ``map_keys``, ``map_values``,
``cardinality``, ``array_has``); what Spark answers otherwise (checked
against Spark 4.3 in tests/spark_sql_cases.py):

- ``struct(a, b)`` names its fields as Spark does (the columns' names, else
  ``col1``, ``col2``, ...): sqlglot's Spark reader writes them out.
- A missing key (``m['x']``, ``element_at(m, 'x')``) is NULL in Spark 4.3,
  with ANSI mode on and off: DataFusion's ``m[k]`` too.
- A map with a NULL key or a key twice fails in Spark
  (``NULL_MAP_KEY``, ``DUPLICATED_MAP_KEY``, the default
  ``spark.sql.mapKeyDedupPolicy=EXCEPTION``). Literal keys are checked
  here; other keys are guarded so that such a row divides by zero, which
  runs the query again on Spark SQL and gives Spark's own error
  (``SparkDataFrame.collect``), not DataFusion's "map key ..." error.
- ``size`` of a NULL map: NULL with ANSI mode, -1 without (as of an array).
- Structs group as in Spark; a struct is a sort key only in the default
  NULL order (:func:`_rule_ordered`). Structs and maps are not compared
  here (a struct's field names do not survive a stage boundary in every
  plan, and DataFusion then casts a struct to a struct it cannot name), nor
  maps grouped (:func:`_rule_grouped`).

``explode(m)`` in a select list gives ``key`` and ``value`` columns
(:func:`_rule_explode`).

Not translated (run on Spark SQL): ``map()`` without entries,
``map_from_entries``, a named or outer ``explode`` of a map, a map in a
``LATERAL VIEW``, a struct sorted ``NULLS LAST`` ascending (or ``NULLS
FIRST`` descending), structs and maps compared, maps grouped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeGuard

from sqlglot import exp

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.collection_rules import COLLECTION_RULES
from distfusion.spark_sql.nodes import T, Translation, cast_to, paren, unsupported

__all__ = ["NAMED_STRUCT_RULES", "STRUCT_RULES", "struct_type"]


def _fn(name: str, *args: exp.Expr) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _is(t: exp.DataType | None, kind: exp.DType) -> TypeGuard[exp.DataType]:
    return t is not None and t.this == kind


def _fields(t: exp.DataType) -> list[tuple[str, exp.DataType]]:
    """A STRUCT type's fields: (name, type) in order."""
    return [(f.name, f.args.get("kind")) for f in t.expressions]


def _map_parts(t: exp.DataType | None) -> tuple[exp.DataType, exp.DataType] | None:
    if not _is(t, T.MAP) or len(t.expressions) != 2:
        return None
    return t.expressions[0], t.expressions[1]


def _element(t: exp.DataType | None) -> exp.DataType | None:
    if not _is(t, T.ARRAY) or not t.expressions:
        return None
    return t.expressions[0]


def _build(text: str) -> exp.DataType:
    return exp.DataType.build(text, dialect="spark")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _struct_of(fields: list[tuple[str, exp.DataType]]) -> exp.DataType:
    return _build("STRUCT<" + ", ".join(f"{_quoted(n)}: {t.sql('spark')}" for n, t in fields) + ">")


def _field(t: exp.DataType, name: str) -> exp.DataType | None:
    """The type of field ``name`` of STRUCT ``t`` (Spark resolves it case-insensitively)."""
    matches = [ft for n, ft in _fields(t) if n.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def _key_name(node: exp.Expr) -> str | None:
    """The field a ``s['a']`` / ``s.a`` names, or None when it is not a literal name."""
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    if isinstance(node, exp.Identifier):
        return node.this
    return None


def struct_type(t: Translation, node: exp.Expr) -> exp.DataType | None:
    """Spark's type of a struct or map expression ``node``, or None (another node, or unknown)."""
    if isinstance(node, exp.Struct):
        fields = []
        for item in node.expressions:
            if not isinstance(item, exp.PropertyEQ):
                return None
            ft = t.type_of(item.expression)
            if ft is None:
                return None
            fields.append((item.this.name, ft))
        return _struct_of(fields) if fields else None
    if isinstance(node, exp.Dot):
        base = t.type_of(node.this)
        return _field(base, node.name) if _is(base, T.STRUCT) else None
    if isinstance(node, exp.Bracket) and len(node.expressions) == 1:
        base = t.type_of(node.this)
        if _is(base, T.STRUCT) and (name := _key_name(node.expressions[0])) is not None:
            return _field(base, name)
        parts = _map_parts(base)
        return parts[1] if parts else None
    if isinstance(node, exp.VarMap):
        keys, values = node.args["keys"].expressions, node.args["values"].expressions
        if not keys:
            return None
        k, v = t.common_type(keys), t.common_type(values)
        if k is None or v is None:
            return None
        return _build(f"MAP<{k.sql('spark')}, {v.sql('spark')}>")
    if isinstance(node, exp.Map):  # map_from_arrays
        k, v = (
            _element(t.type_of(e) if (e := node.args.get(a)) is not None else None)
            for a in ("keys", "values")
        )
        if k is None or v is None:
            return None
        return _build(f"MAP<{k.sql('spark')}, {v.sql('spark')}>")
    if isinstance(node, exp.MapKeys) or _named(node, "map_values"):
        inner = node.this if isinstance(node, exp.MapKeys) else _arg(node)
        parts = _map_parts(t.type_of(inner)) if inner is not None else None
        if parts is None:
            return None
        return _build(f"ARRAY<{parts[0 if isinstance(node, exp.MapKeys) else 1].sql('spark')}>")
    if isinstance(node, exp.MapContainsKey):
        return _build("BOOLEAN")
    if _named(node, "cardinality") or (
        isinstance(node, exp.ArraySize) and _is(t.type_of(node.this), T.MAP)
    ):
        return _build("INT")
    return None


def _named(node: exp.Expr, name: str) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == name


def _arg(node: exp.Expr) -> exp.Expr | None:
    return node.expressions[0] if len(node.expressions) == 1 else None


# ----------------------------------------------------------------------------- structs


def _rule_struct(t: Translation, node: exp.Struct) -> exp.Expr:
    """``named_struct('a', x, ...)`` / ``struct(x, ...)``: DataFusion's ``named_struct``."""
    if t.type_of(node) is None:
        raise SparkSemanticsError(f"{unsupported(node)}: a field's type is not known here")
    args: list[exp.Expr] = []
    for item in node.expressions:
        value, spark_type = item.expression, t.need(item.expression, "a struct's field")
        if spark_type.this in (T.TEXT, T.VARCHAR):  # Utf8, as a struct column's strings
            value = _fn("arrow_cast", value, exp.Literal.string("Utf8"))
        elif spark_type.this not in (T.STRUCT, T.MAP, T.ARRAY):  # a literal 2: INT, not Int64
            value = cast_to(value, spark_type)
        args += [exp.Literal.string(item.this.name), value]
    return _fn("named_struct", *args)


def _rule_dot(t: Translation, node: exp.Dot) -> exp.Expr:
    """``s.a`` of a struct expression: ``get_field(s, 'a')`` (the name as the struct spells it)."""
    base = t.type_of(node.this)
    if not _is(base, T.STRUCT) or t.type_of(node) is None:
        raise SparkSemanticsError(f"{unsupported(node)}: not a field of a struct of known type")
    return _get_field(node.this, base, node.name)


def _get_field(this: exp.Expr, struct: exp.DataType, name: str) -> exp.Expr:
    spelled = next(n for n, _ in _fields(struct) if n.lower() == name.lower())
    return _fn("get_field", this, exp.Literal.string(spelled))


def _rule_bracket(t: Translation, node: exp.Bracket) -> exp.Expr:
    """``s['a']``, ``m[k]``, ``element_at(m, k)``: a struct's field or a map's value.

    A missing key is NULL (Spark 4.3, with ANSI mode on and off), as
    DataFusion's ``map_extract(m, k)[1]``. Arrays' ``a[i]`` and ``element_at(a, i)`` are
    not translated (Spark's ANSI mode fails an index out of range).
    """
    base = t.type_of(node.this)
    if len(node.expressions) != 1 or t.type_of(node) is None:
        raise SparkSemanticsError(f"{unsupported(node)}: not translated")
    key = node.expressions[0]
    if _is(base, T.STRUCT):
        name = _key_name(key)
        assert name is not None  # else the node has no type (struct_type), refused above
        return _get_field(node.this, base, name)
    parts = _map_parts(base)
    if parts is None:
        raise SparkSemanticsError(f"{unsupported(node)}: not translated")
    if isinstance(key, exp.Null):
        return cast_to(exp.Null(), parts[1])
    # map_extract coerces the key to the map's key type (``m[k]`` compares Utf8 with Utf8View)
    found = _fn("map_extract", node.this, _key_as(t, node, key, parts[0]))
    return exp.Bracket(this=found, expressions=[exp.Literal.number(1)])


def _key_as(t: Translation, node: exp.Expr, key: exp.Expr, to: exp.DataType):
    """``key`` as a map's key type ``to``, as Spark casts it; another kind of type stops."""
    kt = t.need(key, "map key")
    if kt == to:
        return key
    both = (kt, to)
    if all(st.is_integral(x) for x in both) or all(
        _is(x, T.TEXT) or _is(x, T.VARCHAR) for x in both
    ):
        return cast_to(key, to)
    msg = f"{unsupported(node)}: a {kt.sql('spark')} key of a map of {to.sql('spark')} keys"
    raise SparkSemanticsError(msg)


# ----------------------------------------------------------------------------- maps


def _failing_when(cond: exp.Expr, value: exp.Expr, to: exp.DataType) -> exp.Expr:
    """``value``, or where ``cond`` holds a division by zero (reruns the query on Spark SQL).

    ``1 / (CAST(cond AS INT) - 1)`` divides by zero just where ``cond`` is
    true, and DataFusion cannot fold it away while planning.
    """
    zero = exp.Sub(this=cast_to(paren(cond.copy()), "INT"), expression=exp.Literal.number(1))
    failing = cast_to(exp.Div(this=exp.Literal.number(1), expression=exp.Paren(this=zero)), to)
    return exp.Case(ifs=[exp.If(this=cond, true=failing)], default=value)


def _elements(node: exp.Expr) -> list[exp.Expr]:
    """The elements of ``map()``'s keys or values: an ``array()``, or its ``make_array`` rewrite."""
    return list(node.expressions)


def _bare(node: exp.Expr) -> exp.Expr:
    """``node`` without the casts the array rule put around it."""
    while isinstance(node, exp.Cast):
        node = node.this
    return node


def _rule_var_map(t: Translation, node: exp.VarMap) -> exp.Expr:
    """``map(k1, v1, ...)``: ``map([k1, ...], [v1, ...])``, keys and values of Spark's common types.

    A NULL key or a key twice fails as Spark does (this module's docstring).
    """
    out = t.type_of(node)
    if out is None:
        raise SparkSemanticsError("map() without entries, or of keys or values without a type")
    parts = _map_parts(out)
    assert parts is not None  # a map()'s type is a MAP (struct_type)
    kt, vt = parts
    keys = [k if t.type_of(k) == kt else cast_to(k, kt) for k in _elements(node.args["keys"])]
    values = [v if t.type_of(v) == vt else cast_to(v, vt) for v in _elements(node.args["values"])]
    bare = [_bare(k) for k in keys]
    if any(isinstance(k, exp.Null) for k in bare):
        raise SparkSemanticsError("map() with a NULL key: Spark fails (NULL_MAP_KEY)")
    literals = [k.this for k in bare if isinstance(k, exp.Literal)]
    if len(set(literals)) < len(literals):
        raise SparkSemanticsError("map() with a key twice: Spark fails (DUPLICATED_MAP_KEY)")
    guarded = []
    for i, key in enumerate(keys):
        if all(isinstance(k, exp.Literal) for k in bare[: i + 1]):
            guarded.append(key)  # literal keys, distinct: checked above
            continue
        cond: exp.Expr = exp.Is(this=paren(key.copy()), expression=exp.Null())
        for earlier in keys[:i]:
            same = exp.EQ(this=paren(key.copy()), expression=paren(earlier.copy()))
            cond = exp.Or(this=cond, expression=same)
        guarded.append(_failing_when(cond, key, kt))
    return _fn("map", _fn("make_array", *guarded), _fn("make_array", *values))


def _rule_array(t: Translation, node: exp.Array) -> exp.Expr:
    """``array(...)`` of structs or maps of one type: ``make_array``; else the array rule's."""
    types = [t.type_of(e) for e in node.expressions]
    nested = [x for x in types if _is(x, T.STRUCT) or _is(x, T.MAP)]
    if not nested:
        return COLLECTION_RULES[exp.Array](t, node)
    if any(x != types[0] for x in types):
        raise SparkSemanticsError("array() of structs or maps of several types: not translated")
    return _fn("make_array", *node.expressions)


def _rule_map_from_arrays(t: Translation, node: exp.Map) -> exp.Expr:
    """``map_from_arrays(k, v)``: DataFusion's ``map(k, v)``.

    A NULL key, a key twice or arrays of two lengths fail the row with a
    division by zero (the query runs again on Spark SQL, which raises its
    error); a NULL array gives a NULL map in both.
    """
    if t.type_of(node) is None:
        raise SparkSemanticsError(f"{unsupported(node)}: arrays of unknown elements")
    keys, values = node.args["keys"], node.args["values"]
    n = _fn("cardinality", paren(keys.copy()))
    bad = exp.Or(
        this=exp.NEQ(
            this=_fn("cardinality", _fn("array_distinct", paren(keys.copy()))), expression=n
        ),
        expression=exp.Or(
            this=exp.NEQ(this=_fn("cardinality", paren(values.copy())), expression=n.copy()),
            expression=_fn("array_has", paren(keys.copy()), exp.Null()),
        ),
    )
    guarded = _failing_when(bad, keys, t.need(keys, "map()"))
    return _fn("map", guarded, values)


def _rule_map_keys(t: Translation, node: exp.Expr) -> exp.Expr:
    """``map_keys(m)`` / ``map_values(m)``: DataFusion's functions of those names."""
    arg = node.this if isinstance(node, exp.MapKeys) else _arg(node)
    if arg is None or t.type_of(node) is None:  # no argument: no type either
        raise SparkSemanticsError(f"{unsupported(node)} of anything but a map")
    return _fn("map_keys" if isinstance(node, exp.MapKeys) else "map_values", arg)


def _rule_map_contains_key(t: Translation, node: exp.MapContainsKey) -> exp.Expr:
    """``map_contains_key(m, k)``: ``array_has(map_keys(m), k)`` (NULL for a NULL map)."""
    parts = _map_parts(t.type_of(node.this))
    key = node.args.get("key")
    if parts is None or key is None or isinstance(key, exp.Null):
        raise SparkSemanticsError(f"{unsupported(node)} other than of a map and a key")
    return _fn("array_has", _fn("map_keys", node.this), _key_as(t, node, key, parts[0]))


def size_of_map(t: Translation, arg: exp.Expr) -> exp.Expr:
    """``size(m)`` / ``cardinality(m)`` (INT): NULL for a NULL map with ANSI mode, else -1."""
    size = cast_to(_fn("cardinality", arg), "INT")
    if t.settings.ansi:
        return size
    return exp.Coalesce(this=size, expressions=[exp.Literal.number(-1)])


def _rule_cardinality(t: Translation, node: exp.Anonymous) -> exp.Expr:
    """``cardinality(x)``: Spark's ``size`` of a map or an array."""
    arg = _arg(node)
    at = t.type_of(arg) if arg is not None else None
    if arg is None or not (_is(at, T.MAP) or _is(at, T.ARRAY)):
        raise SparkSemanticsError(f"{unsupported(node)} of anything but a map or an array")
    return size_of_map(t, arg)


def _rule_size(t: Translation, node: exp.ArraySize) -> exp.Expr:
    """``size(m)`` of a map (:func:`size_of_map`); of an array, the array rule's."""
    if _is(t.type_of(node.this), T.MAP):
        return size_of_map(t, node.this)
    return COLLECTION_RULES[exp.ArraySize](t, node)


def _flat_struct(t: exp.DataType) -> bool:
    """A STRUCT of scalar fields only."""
    return t.this == T.STRUCT and all(
        ft is not None and ft.this not in (T.STRUCT, T.MAP, T.ARRAY) for _, ft in _fields(t)
    )


def _rule_grouped(t: Translation, node: exp.Expr) -> exp.Expr:
    """``GROUP BY`` or ``DISTINCT`` keys that are not maps (Spark groups maps by sorted keys).

    Spark 4 groups maps as their entries sorted by key; DataFusion by their
    entries as stored. A ``GROUP BY`` goes on to the translator's own rule.
    """
    keys = node.expressions
    if isinstance(node, exp.Distinct) and not keys and isinstance(node.parent, exp.Select):
        keys = node.parent.expressions  # SELECT DISTINCT: its select list
    for key in keys:
        if _is(t.type_of(key), T.MAP):
            raise SparkSemanticsError(
                f"a map in {node.key.upper()}: Spark groups its sorted entries"
            )
    if isinstance(node, exp.Group):
        translate = importlib.import_module("distfusion.spark_sql.translate")  # imports this
        return translate._rule_group(t, node)  # noqa: SLF001 - the rule this one extends
    return node


def _rule_explode(t: Translation, node: exp.Explode) -> exp.Expr:
    """``explode(m)`` of a map, an item of a select list: columns ``key`` and ``value``.

    Two unnests in one select list, of ``map_keys(m)`` and ``map_values(m)``,
    which DataFusion zips row by row; no row for a NULL or empty map, as
    Spark. Of an array: the array rule's. Named (``AS (k, v)``), outer or
    in a ``LATERAL VIEW``: not translated.
    """
    if not _is(t.type_of(node.this), T.MAP):
        return COLLECTION_RULES[exp.Explode](t, node)
    item = node.parent if isinstance(node.parent, exp.Alias) else node  # qualify's alias
    select = item.parent
    if not isinstance(select, exp.Select) or node.meta.get("outer") or node.expressions:
        raise SparkSemanticsError("explode() of a map other than as an unnamed select item")
    at = next(i for i, e in enumerate(select.expressions) if e is item)
    others = [e for e in select.expressions if e is not item]
    if any(e.find(exp.Explode) or any(_named(f, "unnest") for f in e.walk()) for e in others):
        raise SparkSemanticsError("explode() of a map beside another generator: not translated")
    keys = exp.alias_(_fn("unnest", _fn("map_keys", node.this.copy())), "key")
    values = exp.alias_(_fn("unnest", _fn("map_values", node.this.copy())), "value")
    select.set(
        "expressions", [*select.expressions[:at], keys, values, *select.expressions[at + 1 :]]
    )
    return keys  # in its place already (where the translator puts it: the same spot)


def _rule_ordered(t: Translation, node: exp.Ordered) -> exp.Expr:
    """A sort key (``ORDER BY``, a window's order): a struct only in Spark's NULL order.

    Spark orders a struct's NULL fields first (ascending) whatever the key's
    NULL order; DataFusion's fields follow the key's. ``ASC NULLS FIRST``
    and ``DESC NULLS LAST`` (the defaults) agree, of a struct of scalars;
    a map Spark does not sort.
    """
    k = t.type_of(node.this)
    if k is None or k.this not in (T.STRUCT, T.MAP):
        return node
    default = bool(node.args.get("nulls_first")) == (not node.args.get("desc"))
    if not (default and _flat_struct(k)):
        msg = f"ORDER BY a {k.this.name.lower()}: Spark orders its NULL fields first"
        raise SparkSemanticsError(msg)
    return node


STRUCT_RULES: dict[type[exp.Expr], Callable[[Translation, Any], exp.Expr]] = {
    exp.Struct: _rule_struct,
    exp.PropertyEQ: lambda t, n: n,  # a field of a struct(...): its rule reads it
    exp.Dot: _rule_dot,
    exp.Bracket: _rule_bracket,
    exp.VarMap: _rule_var_map,
    exp.Map: _rule_map_from_arrays,
    exp.MapKeys: _rule_map_keys,
    exp.MapContainsKey: _rule_map_contains_key,
    exp.ArraySize: _rule_size,
    exp.Array: _rule_array,
    exp.Ordered: _rule_ordered,
    exp.Explode: _rule_explode,
    exp.Group: _rule_grouped,
    exp.Distinct: _rule_grouped,
    exp.ColumnDef: lambda t, n: n,  # a field of a STRUCT<...> type
}
"""The node classes of structs and maps -> their rules (part of ``translate.RULES``)."""

NAMED_STRUCT_RULES: dict[str, Callable[[Translation, Any], exp.Expr]] = {
    "map_values": _rule_map_keys,
    "cardinality": _rule_cardinality,
}
"""Functions sqlglot reads as ``Anonymous`` (lower-case name -> rule)."""
