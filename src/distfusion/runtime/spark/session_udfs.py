"""A SparkSession's own Python UDFs, run in distfusion's tasks with Spark's conversions.

A function registered in a classic session (``spark.udf.register(name, f,
returnType)``, or a ``@udf``, ``@pandas_udf`` or ``@arrow_udf`` registered by
name) is found by name in Spark's analysis of the query: each call is a
``PythonUDF`` expression holding the function as PySpark pickled it, its
evaluation type, its return type and its arguments' types. distfusion
registers it in the query's context as a scalar UDF of those types
(:func:`distfusion.udf`), so it runs in the tasks like any other, and the
values it sees and returns are converted as Spark's Python worker converts
them:

- **plain Python UDFs** (``SQL_BATCHED_UDF``, ``SQL_ARROW_BATCHED_UDF``): one
  call per row, ``None`` for NULL; arguments of the types in :data:`_PLAIN`
  arrive as Spark gives them (``int``, ``float``, ``str``, ``bool``,
  ``bytes``, ``datetime.date``, ``decimal.Decimal`` at the column's scale).
  Spark converts a returned value of another Python type its own way (NULL,
  a wrapped integer, ``str()`` of it, depending on the path), so such a value
  fails the native run and the query runs on Spark SQL, which answers it.
- **pandas UDFs** (``SQL_SCALAR_PANDAS_UDF``) and **Arrow UDFs**
  (``SQL_SCALAR_ARROW_UDF``): PySpark's own conversions
  (``ArrowBatchTransformer.to_pandas``, ``PandasToArrowConversion.convert``,
  ``ArrowBatchTransformer.enforce_schema``) with the session's settings, as
  ``pyspark/worker.py`` calls them. A batch's rows are DataFusion's batch, not
  Spark's (a pandas UDF is elementwise by contract).

An exception raised by the function fails the native run the same way, and
Spark's rerun raises its own error. Spark Connect sessions keep their Python
functions on the server: a query calling one runs on Spark SQL.

Source: PySpark 4.3, ``pyspark/worker.py`` (``read_single_udf``,
``SQL_SCALAR_PANDAS_UDF``, ``SQL_SCALAR_ARROW_UDF``) and
``pyspark/sql/udf.py`` (``_wrap_function``: the pickled ``(func,
returnType)``).
"""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import sqlglot.expressions as exp

from distfusion.errors import SparkSemanticsError
from distfusion.udfs import udf

__all__ = ["SPARK_UDF_ERROR", "SessionUdf", "called_functions", "session_udfs"]

SPARK_UDF_ERROR = "Spark Python UDF value"
"""Starts the message of a native run's failure that Spark SQL answers instead."""

_EVAL_KINDS = {100: "plain", 101: "plain", 200: "pandas", 250: "arrow"}
"""``PythonEvalType`` codes distfusion runs (PySpark ``pyspark.util.PythonEvalType``)."""

_PLAIN: dict[str, pa.DataType] = {
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
}
"""Spark's type names (``DataType.json()``) whose values convert alike on every path."""

_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_PANDAS = "spark.sql.execution.pythonUDF.pandas"
_SETTINGS = {  # pyspark/worker.py's RunnerConf: the setting, and its default there
    "timezone": ("spark.sql.session.timeZone", "UTC"),
    "safecheck": ("spark.sql.execution.pandas.convertToArrowArraySafely", "false"),
    "prefer_int_ext_dtype": (f"{_PANDAS}.preferIntExtensionDtype", "false"),
    "large_var_types": ("spark.sql.execution.arrow.useLargeVarTypes", "false"),
    "int_to_decimal": (f"{_PANDAS}.intToDecimalCoercionEnabled", "false"),
}


def called_functions(parsed: exp.Expr) -> set[str]:
    """Names (lower case) of the functions in ``parsed`` that sqlglot does not know."""
    return {node.name.lower() for node in parsed.find_all(exp.Anonymous)}


def _arrow_type(spark_json: str, what: str) -> pa.DataType:
    """The Arrow type of Spark's type ``spark_json`` (``DataType.json()``) for :data:`_PLAIN` types.

    Raises:
        SparkSemanticsError: another type (``what`` names the value).
    """
    name = json.loads(spark_json)
    if isinstance(name, str):
        if name in _PLAIN:
            return _PLAIN[name]
        m = _DECIMAL.fullmatch(name)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
    msg = f"{what} is of Spark type {spark_json}, which distfusion does not pass to Python UDFs"
    raise SparkSemanticsError(msg)


@dataclass
class SparkUdfCall:
    """The function of one session UDF as a DataFusion UDF calls it: Arrow arrays in, one out.

    Pickled with the stage (cloudpickle) for the executors' tasks.
    """

    name: str
    func: Callable[..., Any]
    kind: str  # "plain", "pandas" or "arrow": see the module docstring
    spark_return_type: Any  # pyspark DataType, as the command pickled it
    return_type: pa.DataType
    settings: dict[str, str] = field(default_factory=dict)

    def __call__(self, *arrays: pa.Array) -> pa.Array:
        try:
            if self.kind == "plain":
                return self._plain(arrays)
            if self.kind == "pandas":
                return self._pandas(arrays)
            return self._arrow(arrays)
        except _ReturnMismatch as exc:
            raise ValueError(f"{SPARK_UDF_ERROR}: {exc}") from None
        except Exception as exc:
            msg = f"{SPARK_UDF_ERROR}: {self.name} raised {type(exc).__name__}: {exc}"
            raise ValueError(msg) from exc

    def _plain(self, arrays: tuple[pa.Array, ...]) -> pa.Array:
        columns = [a.to_pylist() for a in arrays]
        values = [self.func(*row) for row in zip(*columns, strict=True)]
        check = _CHECKS[_kind_of(self.return_type)]
        for v in values:
            if v is not None and not check(v, self.return_type):
                msg = (
                    f"{self.name} returned {type(v).__name__} {v!r} for Spark type "
                    f"{self.spark_return_type.simpleString()}; Spark converts it its own way"
                )
                raise _ReturnMismatch(msg)
        return pa.array(values, self.return_type)

    def _pandas(self, arrays: tuple[pa.Array, ...]) -> pa.Array:
        from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
        from pyspark.sql.types import StructField, StructType

        batch = pa.RecordBatch.from_arrays(list(arrays), [f"_{i}" for i in range(len(arrays))])
        series = ArrowBatchTransformer.to_pandas(
            batch,
            timezone=self.settings["timezone"],
            struct_in_pandas="dict",
            ndarray_as_list=False,
            prefer_int_ext_dtype=self.settings["prefer_int_ext_dtype"] == "true",
            df_for_struct=True,
        )
        result = self.func(*series)
        if not hasattr(result, "__len__") or len(result) != len(batch):
            msg = f"{self.name} returned {type(result).__name__}, not a Series of {len(batch)} rows"
            raise _ReturnMismatch(msg)
        out = PandasToArrowConversion.convert(
            [result],
            StructType([StructField("_0", self.spark_return_type)]),
            timezone=self.settings["timezone"],
            safecheck=self.settings["safecheck"] == "true",
            arrow_cast=True,
            prefers_large_types=self.settings["large_var_types"] == "true",
            int_to_decimal_coercion_enabled=self.settings["int_to_decimal"] == "true",
        )
        return out.column(0).cast(self.return_type)

    def _arrow(self, arrays: tuple[pa.Array, ...]) -> pa.Array:
        from pyspark.sql.conversion import ArrowBatchTransformer

        result = self.func(*arrays)
        n = len(arrays[0]) if arrays else None
        if not isinstance(result, pa.Array) or (n is not None and len(result) != n):
            msg = f"{self.name} returned {type(result).__name__}, not a pyarrow Array of {n} rows"
            raise _ReturnMismatch(msg)
        batch = pa.RecordBatch.from_arrays([result], ["_0"])
        target = pa.schema([pa.field("_0", self.return_type)])
        return ArrowBatchTransformer.enforce_schema(batch, target).column(0)


class _ReturnMismatch(Exception):
    """A returned value whose conversion is Spark's own (see :class:`SparkUdfCall`)."""


def _kind_of(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    return str(t)


def _int_fits(v: Any, t: pa.DataType) -> bool:
    bits = t.bit_width - 1
    return type(v) is int and -(2**bits) <= v < 2**bits


def _decimal_fits(v: Any, t: pa.DataType) -> bool:
    if not isinstance(v, decimal.Decimal) or not v.is_finite():
        return False
    sign, digits, exponent = v.as_tuple()
    return exponent == -t.scale and len(digits) <= t.precision


_CHECKS: dict[str, Callable[[Any, pa.DataType], bool]] = {
    "int": _int_fits,
    "float": lambda v, t: type(v) is float,
    "decimal": _decimal_fits,
    "string": lambda v, t: type(v) is str,
    "bool": lambda v, t: type(v) is bool,
    "binary": lambda v, t: type(v) is bytes,
    "date32[day]": lambda v, t: type(v) is datetime.date,
}
"""Returned values every Spark path converts to the same value: exactly the type's own."""


@dataclass(frozen=True)
class SessionUdf:
    """One Python UDF of a Spark session as the query calls it.

    Attributes:
        name: its name in the session (lower case).
        call: the function as the tasks call it.
        input_types: the Arrow types of its arguments (Spark's analysis).
        deterministic: Spark's flag (``asNondeterministic()`` clears it).
    """

    name: str
    call: SparkUdfCall
    input_types: tuple[pa.DataType, ...]
    deterministic: bool

    def datafusion_udf(self):
        """The :func:`distfusion.udf` that runs it (volatile unless deterministic)."""
        volatility = "immutable" if self.deterministic else "volatile"
        return udf(
            self.call, list(self.input_types), self.call.return_type, volatility, self.name
        )


def session_udfs(spark, query: str, names: set[str]) -> list[SessionUdf]:
    """The session's Python UDFs among ``names`` that ``query`` calls, from Spark's analysis.

    Args:
        spark: the SparkSession (classic).
        query: the Spark SQL query; analyzed by Spark, not run.
        names: function names (lower case) to look for, e.g. :func:`called_functions`.

    Returns:
        One :class:`SessionUdf` per name the session knows as a Python UDF;
        names it does not know (built-ins, unknown names) are left out.

    Raises:
        SparkSemanticsError: a UDF distfusion cannot run with Spark's
            conversions (the message says why): a Spark Connect session, an
            evaluation type other than plain, pandas or Arrow scalar, an
            argument or return type outside :data:`_PLAIN` and decimals,
            named arguments, no arguments, or one name called with
            different argument types.
    """
    if not names:
        return []
    if getattr(spark, "_jsparkSession", None) is None:  # Connect: the catalog has the names
        for f in spark.catalog.listFunctions():
            if f.name.lower() in names and f.isTemporary and not _builtin(f.className):
                msg = f"{f.name} is a Spark Connect session's Python UDF: its code is on the server"
                raise SparkSemanticsError(msg)
        return []
    text = query.strip().rstrip(";").strip()
    try:
        frame = spark.sql(f"SELECT * FROM (\n{text}\n)")
        plan = frame._jdf.queryExecution().analyzed()  # noqa: SLF001 - no public analyzed plan
    except Exception:  # Spark rejects the query: its own error comes from the schema check
        return []
    jvm = spark._jvm  # noqa: SLF001 - the analyzed plan's classes
    if not plan.containsPattern(jvm.org.apache.spark.sql.catalyst.trees.TreePattern.PYTHON_UDF()):
        return []  # one call: the tree's pattern bits, subqueries included
    found: dict[str, SessionUdf] = {}
    for node in _python_udfs(plan, jvm):
        name = str(node.name()).lower()
        if name not in names:
            continue
        one = _session_udf(spark.conf, jvm, node, name)
        seen = found.get(name)
        if seen is not None and seen.input_types != one.input_types:
            msg = f"the Python UDF {name} is called with different argument types"
            raise SparkSemanticsError(msg)
        found[name] = one
    return list(found.values())


def _builtin(class_name: str | None) -> bool:
    return (class_name or "").startswith("org.apache.spark.sql.catalyst.")


def _python_udfs(plan, jvm) -> list[Any]:
    """Every ``PythonUDF`` expression in ``plan`` and its subqueries (py4j objects)."""
    subquery = jvm.java.lang.Class.forName(
        "org.apache.spark.sql.catalyst.expressions.SubqueryExpression"
    )
    out: list[Any] = []
    plans: list[Any] = [plan]  # py4j objects
    exprs: list[Any] = []
    while plans or exprs:
        if plans:
            p = plans.pop()
            plans.extend(_seq(p.children()))
            exprs.extend(_seq(p.expressions()))
            continue
        e = exprs.pop()
        if e.getClass().getSimpleName() == "PythonUDF":
            out.append(e)
        if subquery.isInstance(e):
            plans.append(e.plan())
        exprs.extend(_seq(e.children()))
    return out


def _seq(seq) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _session_udf(conf, jvm, node, name: str) -> SessionUdf:
    eval_type = int(node.evalType())
    kind = _EVAL_KINDS.get(eval_type)
    if kind is None:
        msg = f"the Python UDF {name} has evaluation type {eval_type} (not a scalar UDF)"
        raise SparkSemanticsError(msg)
    args = _seq(node.children())
    if not args:
        raise SparkSemanticsError(f"the Python UDF {name} takes no arguments")
    if any(a.getClass().getSimpleName() == "NamedArgumentExpression" for a in args):
        raise SparkSemanticsError(f"the Python UDF {name} is called with named arguments")
    inputs = tuple(
        _arrow_type(str(a.dataType().json()), f"argument {i + 1} of {name}")
        for i, a in enumerate(args)
    )
    returns = _arrow_type(str(node.dataType().json()), f"the result of {name}")
    command = bytes(node.func().command().toArray(jvm.scala.reflect.ClassTag.Byte()))
    try:  # PySpark's own pickle of the session's function
        func, spark_type = pickle.loads(command)  # noqa: S301
    except Exception as exc:  # a broadcast command (over 1 MB), or another PySpark's layout
        msg = f"the Python UDF {name}'s function cannot be read here ({type(exc).__name__})"
        raise SparkSemanticsError(msg) from exc
    if kind != "plain":
        try:  # the conversions pyspark/worker.py uses (PySpark 4.3)
            from pyspark.sql.conversion import (  # noqa: F401
                ArrowBatchTransformer,
                PandasToArrowConversion,
            )
        except ImportError as exc:
            msg = f"this PySpark lacks the conversions of {kind} UDFs distfusion uses ({exc})"
            raise SparkSemanticsError(msg) from exc
    settings = {k: str(conf.get(key, default)) for k, (key, default) in _SETTINGS.items()}
    call = SparkUdfCall(name, func, kind, spark_type, returns, settings)
    return SessionUdf(name, call, inputs, bool(node.udfDeterministic()))
