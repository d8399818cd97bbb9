"""Result comparison against single-node DataFusion.

Rules (from the core issue): same column names and Arrow types, same rows, in order when the
query orders them; floats equal within 1e-9 relative (a distributed sum adds in
another order); everything else, decimals included, exactly equal (a
distributed decimal average divides in decimal arithmetic as DataFusion does).
Where DataFusion itself answers differently for the same rows, no comparison
can hold and the fuzzer (tests/fuzz_sql.py) does not generate the query:

- grouped ``min``/``max`` of a float column holding NaN: DataFusion 55's
  grouped accumulator skips a NaN unless it comes first in its batch, the
  global one orders NaN above every number, so the answer depends on how rows
  fall into batches and partitions (tests/test_fuzz.py shows it on DataFusion
  alone).

Against another engine, :func:`assert_same_result` takes ``decimal_ulps``: Spark
SQL rounds a decimal division half up where DataFusion truncates, so its
averages may be one unit apart in the last place.
"""

from __future__ import annotations

import decimal
import math

import pyarrow as pa
import sqlglot
import sqlglot.errors
from datafusion import SessionContext

from distfusion.coordinator.statements import plan_statements, split_statements

FLOAT_REL_TOL = 1e-9


def oracle_result(ctx: SessionContext, sql: str) -> pa.Table:
    """Run every statement of ``sql`` on ``ctx``; the last one with columns is the result."""
    df = plan_statements(ctx, sql)
    assert len(df.schema()) > 0, "no statement returns rows"
    return df.to_arrow_table()


def is_ordered(sql: str) -> bool:
    """True when the result statement has a top-level ORDER BY.

    Parsed with sqlglot, so an ``ORDER BY`` inside an aggregate (``array_agg(x
    ORDER BY y)``), a window or a subquery does not count; SQL sqlglot cannot
    parse is checked textually.
    """
    stmts = [s for s in split_statements(sql) if s.lower().lstrip().startswith(("select", "with"))]
    if not stmts:
        return False
    try:
        tree = sqlglot.parse_one(stmts[-1], dialect="postgres")
    except sqlglot.errors.ParseError:
        return "order by" in stmts[-1].lower()
    return tree.args.get("order") is not None


def _same_value(a, b, decimal_ulps: int = 0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=FLOAT_REL_TOL, abs_tol=1e-12)
    if decimal_ulps and isinstance(a, decimal.Decimal) and isinstance(b, decimal.Decimal):
        ulp = decimal.Decimal(1).scaleb(min(a.as_tuple().exponent, b.as_tuple().exponent))
        return abs(a - b) <= decimal_ulps * ulp
    return a == b


def _sort_value(v):
    """A key that orders every value of one column.

    NULL last, NaN apart from numbers, nested values (lists, structs as dicts)
    by their text.
    """
    if v is None:
        return (True, "", 0)
    if isinstance(v, float) and math.isnan(v):
        return (False, "nan", 0)
    if isinstance(v, (list, dict)):
        return (False, str(type(v)), repr(v))
    return (False, str(type(v)), v)


def _sort_key(row: tuple):
    return tuple(_sort_value(v) for v in row)


def assert_same_result(
    got: pa.Table,
    expected: pa.Table,
    ordered: bool,
    decimal_ulps: int = 0,
    check_types: bool = True,
) -> None:
    """Assert ``got`` equals ``expected`` under the rules above.

    ``decimal_ulps``: units in the last place two decimals may differ by (0:
    equal); only for results of another engine (see the module docs).
    ``check_types``: the Arrow types must be equal too (a timestamp's zone
    included: equal instants in another zone are another answer); False only
    against another engine.

    Raises:
        AssertionError: naming the first differing row and column.
    """
    assert got.column_names == expected.column_names, (got.column_names, expected.column_names)
    if check_types:
        assert got.schema.types == expected.schema.types, (got.schema, expected.schema)
    assert got.num_rows == expected.num_rows, f"{got.num_rows} rows, expected {expected.num_rows}"
    # Rows as tuples (not dicts: a result may repeat a column name).
    rows_g = (
        list(zip(*(c.to_pylist() for c in got.columns), strict=True)) if got.num_columns else []
    )
    rows_e = (
        list(zip(*(c.to_pylist() for c in expected.columns), strict=True))
        if expected.num_columns
        else []
    )
    if not ordered:
        rows_g.sort(key=_sort_key)
        rows_e.sort(key=_sort_key)
    for i, (rg, re) in enumerate(zip(rows_g, rows_e, strict=True)):
        for name, a, b in zip(got.column_names, rg, re, strict=True):
            assert _same_value(a, b, decimal_ulps), (
                f"row {i} column {name}: got {a!r}, expected {b!r}"
            )


def order_keys(sql: str, names: list[str], dialect: str = "spark") -> list[int] | None:
    """The output columns (positions) the result statement's ``ORDER BY`` sorts by.

    A key is an output column's name or position, or an expression the
    select list computes (``substr(s_city, 1, 30)``). ``[]`` without ``ORDER
    BY``; None when a key is none of these (it sorts by what the result does
    not hold).
    """
    tree = sqlglot.parse_one(sql, dialect=dialect)
    order = tree.args.get("order")
    if order is None:
        return []
    projections = [p.unalias() for p in tree.selects]
    keys = []
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, sqlglot.exp.Literal) and key.is_int:
            keys.append(int(key.this) - 1)
        elif isinstance(key, sqlglot.exp.Column) and names.count(key.name) == 1:
            keys.append(names.index(key.name))
        elif projections.count(key) == 1:
            keys.append(projections.index(key))
        else:
            return None
    return keys


def assert_same_answer(got: pa.Table, expected: pa.Table, sql: str, dialect: str = "spark") -> None:
    """:func:`assert_same_result` where rows that tie on every sort key may come in any order.

    ``ORDER BY a LIMIT n`` leaves the order of rows with equal ``a`` open in
    both engines (TPC-DS q77's ROLLUP subtotal and a NULL id, q79's tickets
    of equal profit): the rows as a whole must be equal, and the sort keys in
    order. A sort by what the result does not hold compares the rows in order.
    """
    keys = order_keys(sql, expected.column_names, dialect)
    if keys is None:
        assert_same_result(got, expected, ordered=True)
        return
    assert_same_result(got, expected, ordered=False)
    assert_same_result(got.select(keys), expected.select(keys), ordered=True)
