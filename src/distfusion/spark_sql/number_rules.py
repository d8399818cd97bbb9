"""Rules for numbers Spark computes otherwise than DataFusion: ``round``, ``bround``, percentiles.

``bround`` (HALF_EVEN) takes the same routes as ``round`` (HALF_UP): the
half-up DECIMAL goes one unit back toward zero at a tie whose last digit
is odd. Negative digits (integers, DECIMALs) round ``x * 10^d``, an exact
DECIMAL product, to an integer and multiply back; an integer past its
type fails the cast, so Spark SQL answers (its error with ANSI mode, the
wrapped value without).

``round(x, d)`` of a DOUBLE: Spark rounds the decimal text of ``x``
(``RoundBase``: ``BigDecimal(x).setScale(d, HALF_UP).toDouble``, the text of
``java.lang.Double.toString``), DataFusion its binary value:
``round(2.675, 2)`` is 2.68 in Spark (``2.675``), 2.67 in DataFusion
(2.67499999...). Here the shortest text that reads back as ``x``
(DataFusion's ``CAST(x AS VARCHAR)``) is read as a ``DECIMAL(38, 22)``,
rounded half up to ``d`` digits and cast to DOUBLE (:func:`round_double`).

Why that is Spark's answer, with the exact value's rounding interval ``I``
of ``x`` (the reals that read back as ``x``) and a *tie* ``(k + 1/2) 10^-d``:

- Java 19+ writes the shortest text, as DataFusion. JDK 17's
  ``FloatingDecimal`` (Steele and White's digit loop) may write more
  digits, but always a text inside ``I``. Rounding half up is constant
  between two ties: without a tie in ``I``, every text in ``I`` rounds
  alike.
- Where ``I`` is narrower than ``10^-(d+1)`` (``|x| < 2^m_d``) and holds a
  tie, the tie is the shortest text (no text of ``d`` digits fits in
  ``I``), and the loop stops at its last digit too: it writes digits of
  the exact value until the truncation or the truncation plus one unit is
  strictly within half an ulp, which first happens at the tie's digit.
  The exception, a power of two (JDK 17 halves the half ulp there), was
  checked against JDK 17 for every power of two and every ``d``
  (tests/runtime/test_spark_round.py checks some against Spark).
- ``|x| >= 2^52`` is an integer: JDK 17 writes its digits (below
  ``2^63``), and ``x`` is the answer; ``|x| < 4 * 10^-(d+1)`` rounds to
  0.0 (positive: Java's ``BigDecimal`` zero has no sign).
- Between ``2^m_d`` and ``2^52`` a text of at most ``d`` decimals is
  written as it is by both (the answer is ``x``); any other such value, and
  ``|x| >= 2^63``, fails the native run with a cast error, so the query
  runs again on Spark SQL (``distfusion.spark.SparkDataFrame``).

The DECIMAL's cast to DOUBLE divides its 128-bit integer by ``10^d``, two
exact operands below ``2^53``: correctly rounded, as Java's
``BigDecimal.doubleValue``. ``d`` from 0 to 21; NaN and infinities are
unchanged, NULL stays NULL. A constant ``x`` is not translated: DataFusion
evaluates constant branches while planning, the failing one too.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.nodes import Translation, cast_to

__all__ = [
    "MAX_ROUND_DIGITS",
    "NAMED_NUMBER_RULES",
    "NUMBER_RULES",
    "check_percentile_arguments",
    "narrow_bound",
    "round_double",
]

MAX_ROUND_DIGITS = 21
"""The most digits ``round`` of a double is translated for: ``DECIMAL(38, 22)``
keeps one more digit of a value below ``2^52``."""
_SCALE = MAX_ROUND_DIGITS + 1


def _fn(name: str, *args: exp.Expr) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _double(value: float | str) -> exp.Expr:
    """A DOUBLE literal of ``value`` (its shortest text: the same double)."""
    return cast_to(exp.Literal.string(value if isinstance(value, str) else repr(value)), "DOUBLE")


def narrow_bound(digits: int) -> int:
    """The largest ``m`` with ``2^(m-53) < 10^-(digits+1)``: an ulp below ``2^m`` is narrower."""
    m = 53
    while Fraction(2) ** (m - 53) >= Fraction(1, 10 ** (digits + 1)):
        m -= 1
    return m


def _cut(x: exp.Expr) -> exp.Expr:
    """Whether :func:`_plain_text` of ``x`` cut digits (its exact text is past the 22nd decimal).

    Rounding half up reads alike; a text cut to ``...5000`` would be a false
    tie for HALF_EVEN (the exact text is above it: its last digit is not 0).
    """
    text = cast_to(x.copy(), "STRING")
    power = cast_to(
        _fn("split_part", text.copy(), exp.Literal.string("e"), exp.Literal.number(2)), "INT"
    )
    mantissa = _fn("split_part", text.copy(), exp.Literal.string("e"), exp.Literal.number(1))
    figures = _fn(
        "length",
        _fn(
            "replace",
            _fn("replace", mantissa, exp.Literal.string("-"), exp.Literal.string("")),
            exp.Literal.string("."),
            exp.Literal.string(""),
        ),
    )
    point = exp.Paren(this=exp.Add(this=power, expression=exp.Literal.number(1)))
    decimals = exp.Sub(this=figures, expression=point)
    has_power = exp.GT(
        this=_fn("strpos", text.copy(), exp.Literal.string("e")), expression=exp.Literal.number(0)
    )
    # a CASE of numbers: DataFusion would make one of booleans an AND, computing both sides
    written = exp.Case(ifs=[exp.If(this=has_power, true=decimals)], default=exp.Literal.number(0))
    return exp.GT(this=written, expression=exp.Literal.number(_SCALE))


def _plain_text(x: exp.Expr, digits: int) -> exp.Expr:
    """The shortest text of DOUBLE ``x``, ``|x| < 2^52``, without an exponent.

    DataFusion writes ``|x| < 1e-5`` as ``1.5e-7``, which its cast to a
    DECIMAL rejects: that is written ``0.00000015``, cut after 22 decimals
    (a truncation keeps the rounding at fewer digits). Only ``d >= 5``
    rounds such a value to anything but 0.
    """
    text = cast_to(x.copy(), "STRING")
    if digits < 5:
        return text
    mantissa = _fn("split_part", text.copy(), exp.Literal.string("e"), exp.Literal.number(1))
    power = cast_to(
        _fn("split_part", text.copy(), exp.Literal.string("e"), exp.Literal.number(2)), "INT"
    )
    figures = _fn(
        "replace",
        _fn("replace", mantissa, exp.Literal.string("-"), exp.Literal.string("")),
        exp.Literal.string("."),
        exp.Literal.string(""),
    )
    sign = exp.Case(
        ifs=[
            exp.If(
                this=exp.LT(this=x.copy(), expression=exp.Literal.number(0)),
                true=exp.Literal.string("-"),
            )
        ],
        default=exp.Literal.string(""),
    )
    zeros = _fn(
        "repeat",
        exp.Literal.string("0"),
        exp.Sub(this=exp.Neg(this=power), expression=exp.Literal.number(1)),
    )
    fraction = _fn("concat", exp.Literal.string("0."), zeros, figures)
    # the first 22 decimals: Arrow's cast to a DECIMAL rounds the rest half up
    written = _fn("concat", sign, _fn("left", fraction, exp.Literal.number(2 + _SCALE)))
    has_power = exp.GT(
        this=_fn("strpos", text.copy(), exp.Literal.string("e")), expression=exp.Literal.number(0)
    )
    return exp.Case(ifs=[exp.If(this=has_power, true=written)], default=text)


def _fails(x: exp.Expr, digits: int) -> exp.Expr:
    """A DOUBLE that fails to compute (Arrow's ``Cannot cast string``), naming ``x``."""
    why = _fn(
        "concat",
        exp.Literal.string("round() of the double "),
        cast_to(x.copy(), "STRING"),
        exp.Literal.string(f" to {digits} digits: an answer for Spark SQL"),
    )
    return cast_to(why, "DOUBLE")


def _unit(digits: int) -> exp.Expr:
    """``10^-digits`` (``digits`` may be negative) as an exact DECIMAL literal."""
    if digits >= 0:
        text = "1" if digits == 0 else "0." + "0" * (digits - 1) + "1"
        return cast_to(exp.Literal.string(text), f"DECIMAL({digits + 1}, {digits})")
    return cast_to(exp.Literal.string("1" + "0" * -digits), f"DECIMAL({1 - digits}, 0)")


def _half_even(up: exp.Expr, x: exp.Expr, digits: int, out: str, cut: exp.Expr | None) -> exp.Expr:
    """HALF_EVEN from ``up``, the DECIMAL ``x`` rounded half up to ``digits >= 0`` (type ``out``).

    A tie (``|up - x|`` is half a unit) whose half-up answer ends in an odd
    digit goes one unit back toward zero; DECIMAL arithmetic is exact.
    """
    half = cast_to(
        exp.Literal.string("0." + "0" * digits + "5"), f"DECIMAL({digits + 2}, {digits + 1})"
    )
    gap = exp.Abs(this=exp.Paren(this=exp.Sub(this=up.copy(), expression=x.copy())))
    tie: exp.Expr = exp.EQ(this=gap, expression=half)
    if cut is not None:  # x's text was cut after a 5: above the tie
        tie = exp.And(this=tie, expression=exp.Not(this=cut))
    last = _fn("right", cast_to(up.copy(), "STRING"), exp.Literal.number(1))
    odd = exp.In(this=last, expressions=[exp.Literal.string(c) for c in "13579"])
    back = exp.Case(
        ifs=[
            exp.If(
                this=exp.GT(this=x.copy(), expression=exp.Literal.number(0)),
                true=exp.Sub(this=up.copy(), expression=_unit(digits)),
            )
        ],
        default=exp.Add(this=up.copy(), expression=_unit(digits)),
    )
    return exp.Case(
        ifs=[exp.If(this=exp.And(this=tie, expression=odd), true=cast_to(back, out))],
        default=up,
    )


def _rounded(
    x: exp.Expr, digits: int, out: str, even: bool, cut: exp.Expr | None = None
) -> exp.Expr:
    """A DECIMAL ``x`` rounded to ``digits >= 0`` as the DECIMAL ``out``: half up, or half even.

    DataFusion's cast to a smaller scale rounds half up (away from zero), as Java's HALF_UP.
    """
    up = cast_to(x.copy(), out)
    return _half_even(up, x, digits, out, cut) if even else up


def round_double(x: exp.Expr, digits: int, even: bool = False) -> exp.Expr:
    """Spark's ``round(x, digits)`` (``bround`` if ``even``) of a DOUBLE ``x``, digits 0..21.

    The reasoning is the module's (it holds for HALF_EVEN too: both modes
    are constant between two ties). ``x`` is copied into every branch (an
    aggregate or window in it is computed once by DataFusion).

    Raises:
        SparkSemanticsError: ``digits`` outside 0..21.
    """
    if not 0 <= digits <= MAX_ROUND_DIGITS:
        msg = f"round() of a double to {digits} digits has no Spark-equal translation"
        raise SparkSemanticsError(msg)
    size = exp.Abs(this=x.copy())
    decimal = cast_to(_plain_text(x, digits), f"DECIMAL(38, {_SCALE})")
    cut = _cut(x) if even and digits >= 5 else None
    rounded = _rounded(decimal, digits, f"DECIMAL(38, {digits})", even, cut)
    branches = [
        (
            exp.Or(
                this=_fn("isnan", x.copy()),
                expression=exp.EQ(this=size.copy(), expression=_double("inf")),
            ),
            x.copy(),
        ),
        (exp.GTE(this=size.copy(), expression=_double(2.0**63)), _fails(x, digits)),
        (exp.GTE(this=size.copy(), expression=_double(2.0**52)), x.copy()),
        (exp.LT(this=size.copy(), expression=_double(f"4e-{digits + 1}")), _double(0.0)),
        (
            exp.LT(this=size.copy(), expression=_double(2.0 ** narrow_bound(digits))),
            cast_to(rounded, "DOUBLE"),
        ),
        (exp.NEQ(this=decimal, expression=rounded.copy()), _fails(x, digits)),
    ]
    ifs = [exp.If(this=cond, true=then) for cond, then in branches]
    return exp.Case(ifs=ifs, default=x.copy())  # NULL too


def _digits(arg: exp.Expr | None) -> int:
    """``round``'s digits: an integer literal (0 when omitted)."""
    if arg is None:
        return 0
    negative = isinstance(arg, exp.Neg)
    literal = arg.this if negative else arg
    if not (isinstance(literal, exp.Literal) and not literal.is_string and literal.this.isdigit()):
        raise SparkSemanticsError("round() with digits that are not an integer literal")
    return -int(literal.this) if negative else int(literal.this)


_INTEGER_DIGITS = {
    exp.DataType.Type.TINYINT: 3,
    exp.DataType.Type.SMALLINT: 5,
    exp.DataType.Type.INT: 10,
    exp.DataType.Type.BIGINT: 19,
}


def _round_negative(x: exp.Expr, dec: st.Decimal, digits: int, out: str, even: bool) -> exp.Expr:
    """A DECIMAL ``x`` of type ``dec`` rounded at ``10^-digits`` (``digits < 0``), as ``out``.

    ``x * 10^digits`` is exact (a DECIMAL product), rounded to an integer,
    then times ``10^-digits``; a value past ``out`` fails the cast (Spark SQL
    answers: an error under ANSI mode, a wrapped integer without).
    """
    if dec.precision + 1 - digits + 1 > st.MAX_PRECISION:
        raise SparkSemanticsError(
            f"round() of a DECIMAL({dec.precision}, {dec.scale}) to {digits} digits: "
            "past 38 digits, not translated"
        )
    scaled = exp.Mul(this=exp.Paren(this=x.copy()), expression=_unit(-digits))
    whole = _rounded(scaled, 0, f"DECIMAL({st.MAX_PRECISION}, 0)", even)
    return cast_to(exp.Mul(this=exp.Paren(this=whole), expression=_unit(digits)), out)


def _rule_round(t: Translation, node: exp.Expr) -> exp.Expr:
    """``round(x, d)`` (HALF_UP) and ``bround(x, d)`` (HALF_EVEN) with Spark's types and answers.

    Integers and DECIMALs to any digits (negative: at ``10^-d``; an integer
    keeps its type, a DECIMAL becomes ``DECIMAL(max(p - s + 1, 1 - d), 0)``),
    DOUBLEs to 0..21 digits (:func:`round_double`). A FLOAT is not translated:
    Spark rounds JDK 17's ``Float.toString``, which is not always the
    shortest text DataFusion writes.
    """
    even = isinstance(node, exp.Anonymous)
    name = "bround" if even else "round"
    if even:
        if not 1 <= len(node.expressions) <= 2:
            raise SparkSemanticsError("bround() takes one or two arguments")
        this = node.expressions[0]
        d = _digits(node.expressions[1] if len(node.expressions) > 1 else None)
    else:
        this = node.this
        d = _digits(node.args.get("decimals"))
    xt = t.need(this, name)
    if st.is_integral(xt):
        t.types[id(node)] = xt
        if d >= 0:
            return this
        as_decimal = st.Decimal(_INTEGER_DIGITS[xt.this], 0)
        wide = cast_to(this, f"DECIMAL({as_decimal.precision}, 0)")
        return _round_negative(wide, as_decimal, d, xt.sql("spark"), even)
    if xt.this == exp.DataType.Type.DOUBLE:
        if d < 0:
            raise SparkSemanticsError(
                f"{name}() of a double to negative digits has no Spark-equal translation"
            )
        if this.find(exp.Column) is None:  # DataFusion would fold its failing branches
            raise SparkSemanticsError(f"{name}() of a constant double: not translated")
        t.types[id(node)] = exp.DataType.build("DOUBLE")
        return round_double(this, d, even)
    dec = st.decimal_of(xt)
    if dec is None:
        msg = (
            f"{name}() of a {xt.sql('spark')}: Spark rounds its decimal text "
            "(JDK 17's Float.toString for a FLOAT), DataFusion the binary value"
        )
        raise SparkSemanticsError(msg)
    if d < 0:
        out = exp.DataType.build(
            f"DECIMAL({min(st.MAX_PRECISION, max(dec.precision - dec.scale + 1, 1 - d))}, 0)"
        )
        t.types[id(node)] = out
        return _round_negative(this, dec, d, out.sql("spark"), even)
    out = st.round_type(dec, d).sql_type()
    t.types[id(node)] = out
    if d >= dec.scale:
        return cast_to(this, out)
    return _rounded(this, d, out.sql("spark"), even)


def _rule_bround(t: Translation, node: exp.Anonymous) -> exp.Expr:
    """``bround(x, d)``: :func:`_rule_round` with HALF_EVEN."""
    return _rule_round(t, node)


def check_percentile_arguments(query: str) -> None:
    """Raise for ``percentile(x, p, frequency)`` in ``query``: sqlglot's parser drops the frequency.

    Called on the text (the parsed tree no longer shows the argument).

    Raises:
        SparkSemanticsError: a ``percentile`` call with more than two arguments.
    """
    try:
        tokens = Spark().tokenize(query)
    except TokenError:  # the parser says why
        return
    opening, closing = (
        (TokenType.L_PAREN, TokenType.L_BRACKET),
        (TokenType.R_PAREN, TokenType.R_BRACKET),
    )
    for at, token in enumerate(tokens[:-1]):
        if token.text.lower() != "percentile" or tokens[at + 1].token_type != TokenType.L_PAREN:
            continue
        depth = commas = 0
        for inner in tokens[at + 1 :]:
            if inner.token_type in opening:
                depth += 1
            elif inner.token_type in closing:
                depth -= 1
                if depth == 0:
                    break
            elif inner.token_type == TokenType.COMMA and depth == 1:
                commas += 1
        if commas > 1:
            raise SparkSemanticsError("percentile() with a frequency: not translated")


def _percentages(node: exp.Quantile) -> tuple[list[float], bool]:
    """``percentile``'s percentages (literals in [0, 1]), and whether they are an array."""
    arg = node.args.get("quantile")
    listed = isinstance(arg, exp.Array) or (
        isinstance(arg, exp.Anonymous) and arg.name.lower() == "make_array"  # array(), translated
    )
    items = arg.expressions if listed and arg is not None else [arg]
    values = []
    for item in items:
        while isinstance(item, exp.Cast):  # array()'s common type, 1e-1 as a DOUBLE
            item = item.this
        if not isinstance(item, exp.Literal):
            raise SparkSemanticsError("percentile() of a percentage that is not a number literal")
        try:
            value = float(item.this)
        except ValueError:
            msg = "percentile() of a percentage that is not a number literal"
            raise SparkSemanticsError(msg) from None
        if not 0.0 <= value <= 1.0:  # Spark's error
            raise SparkSemanticsError(
                f"percentile() of the percentage {item.this}: Spark rejects it"
            )
        values.append(value)
    return values, listed


def _same_key(a: exp.Expr, b: exp.Expr, fractional: bool) -> exp.Expr:
    """``a`` and ``b`` equal as Java's ``equals`` (doubles: NaN is NaN, -0.0 is not 0.0)."""
    if not fractional:
        return exp.EQ(this=a, expression=b)
    zero = exp.Literal.number(0)
    one = exp.Literal.number(1)
    nans = exp.And(this=_fn("isnan", a.copy()), expression=_fn("isnan", b.copy()))
    either_nan = exp.Or(this=_fn("isnan", a.copy()), expression=_fn("isnan", b.copy()))
    zeros = exp.And(
        this=exp.EQ(this=exp.Abs(this=a.copy()), expression=zero),
        expression=exp.EQ(this=exp.Abs(this=b.copy()), expression=zero.copy()),
    )
    signs = exp.EQ(
        this=exp.Div(this=one, expression=a.copy()),
        expression=exp.Div(this=one.copy(), expression=b.copy()),
    )
    return exp.Case(
        ifs=[exp.If(this=either_nan, true=nans), exp.If(this=zeros, true=signs)],
        default=exp.EQ(this=a, expression=b),
    )


def _percentile_at(keys: exp.Expr, count: exp.Expr, p: float, fractional: bool) -> exp.Expr:
    """Spark's ``Percentile.getPercentile`` of sorted ``keys`` at ``p``, its double operations.

    ``position = (n - 1) * p``; the key at ``floor`` when ``ceil`` is the
    same position or holds an equal key, else ``lower + (position - floor) *
    (higher - lower)`` (Spark 4.3's; ``(ceil - position) * lower + ...``
    differs in the last bit).
    """
    position = exp.Mul(
        this=cast_to(exp.Sub(this=count.copy(), expression=exp.Literal.number(1)), "DOUBLE"),
        expression=_double(p),
    )
    low, high = _fn("floor", position.copy()), _fn("ceil", position.copy())

    def key(at: exp.Expr) -> exp.Expr:
        index = exp.Add(this=cast_to(at.copy(), "BIGINT"), expression=exp.Literal.number(1))
        return _fn("array_element", keys.copy(), index)  # not a[i]: DataFusion's nth_value

    lower, higher = cast_to(key(low), "DOUBLE"), cast_to(key(high), "DOUBLE")
    interpolated = exp.Add(
        this=lower.copy(),
        expression=exp.Mul(
            this=exp.Paren(this=exp.Sub(this=position.copy(), expression=low.copy())),
            expression=exp.Paren(this=exp.Sub(this=higher, expression=lower.copy())),
        ),
    )
    return exp.Case(
        ifs=[
            exp.If(this=exp.EQ(this=low.copy(), expression=high.copy()), true=lower.copy()),
            exp.If(this=_same_key(key(low), key(high), fractional), true=lower.copy()),
        ],
        default=interpolated,
    )


def _rule_percentile(t: Translation, node: exp.Quantile) -> exp.Expr:
    """``percentile(x, p)`` (exact, Spark's ``Percentile``): interpolated between sorted values.

    ``x`` an integer, a DECIMAL of at most 15 digits (its DOUBLE exact-
    operand division, as Spark's ``Decimal.toDouble``), a FLOAT or a
    DOUBLE; ``p`` a literal in [0, 1] or an array of them (then an array of
    doubles). NULLs are skipped; no value gives NULL. DataFusion's
    ``array_agg`` sorts the values (NaN last, as Spark orders doubles); a
    group holding both 0.0 and -0.0, which Spark orders as equal (the order
    of its hash map), fails the native run (Spark SQL answers it).
    """
    x = node.this
    if isinstance(x, exp.Distinct) or isinstance(node.parent, exp.Window):
        raise SparkSemanticsError(
            "percentile() of DISTINCT values or over a window: not translated"
        )
    xt = t.need(x, "percentile")
    dec = st.decimal_of(xt) if st.is_decimal(xt) else None
    fractional = st.is_fractional(xt)
    if not (st.is_integral(xt) or fractional or (dec is not None and dec.precision <= 15)):
        raise SparkSemanticsError(f"percentile() of a {xt.sql('spark')}: not translated")
    percentages, listed = _percentages(node)
    present = exp.Where(this=exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())))
    order = [exp.Ordered(this=x.copy(), nulls_first=False)]
    if fractional:
        order.insert(0, exp.Ordered(this=_fn("isnan", x.copy()), nulls_first=False))
    keys = exp.Filter(
        this=_fn("array_agg", exp.Order(this=x.copy(), expressions=order)), expression=present
    )
    count = exp.Count(this=x.copy())
    if not listed:
        value = _percentile_at(keys, count, percentages[0], fractional)
        t.types[id(node)] = exp.DataType.build("DOUBLE")
    else:
        value = _fn(
            "make_array", *(_percentile_at(keys, count, p, fractional) for p in percentages)
        )
        t.types[id(node)] = exp.DataType.build("ARRAY<DOUBLE>")
    ifs = [
        exp.If(this=exp.EQ(this=count.copy(), expression=exp.Literal.number(0)), true=exp.Null())
    ]
    if fractional:
        zero = exp.EQ(this=exp.Abs(this=x.copy()), expression=exp.Literal.number(0))
        negative = exp.LT(
            this=exp.Div(this=exp.Literal.number(1), expression=x.copy()),
            expression=exp.Literal.number(0),
        )

        def zeros(sign: exp.Expr) -> exp.Expr:
            counted = exp.Filter(
                this=exp.Count(this=x.copy()),
                expression=exp.Where(this=exp.And(this=zero.copy(), expression=sign)),
            )
            return exp.GT(this=counted, expression=exp.Literal.number(0))

        both = exp.And(this=zeros(negative.copy()), expression=zeros(exp.Not(this=negative.copy())))
        why = _fn(
            "concat",
            exp.Literal.string("percentile() of 0.0 and -0.0 among "),
            cast_to(count.copy(), "STRING"),
            exp.Literal.string(" values: an answer for Spark SQL"),
        )
        fails = cast_to(why, "DOUBLE")
        ifs.append(exp.If(this=both, true=_fn("make_array", fails) if listed else fails))
    return exp.Case(ifs=ifs, default=value)


NUMBER_RULES: dict[type[exp.Expr], Callable[[Translation, Any], exp.Expr]] = {
    exp.Round: _rule_round,
    exp.Quantile: _rule_percentile,
}
"""The node classes of numbers -> their rules (part of ``translate.RULES``)."""

NAMED_NUMBER_RULES: dict[str, Callable[[Translation, Any], exp.Expr]] = {
    "bround": _rule_bround,
}
"""Functions of numbers sqlglot reads as ``Anonymous`` (lower-case name -> rule)."""
