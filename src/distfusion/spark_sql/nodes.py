"""Small builders and tests of sqlglot nodes that the translation rules share."""

from __future__ import annotations

import re
from typing import Any, Protocol

from sqlglot import exp

__all__ = ["T", "Translation", "cast_to", "is_iso_date", "paren", "unsupported"]

T = exp.DataType.Type

_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class Translation(Protocol):
    """What a rule reads of the translation it is part of (``translate._Translator``)."""

    settings: Any  # the SparkSettings followed
    types: dict[int, exp.DataType | None]  # Spark types of nodes, by id; a rule sets its new node's

    def type_of(self, node: exp.Expr) -> exp.DataType | None:
        """Spark's type of ``node``, or None when unknown."""

    def need(self, node: exp.Expr, what: str) -> exp.DataType:
        """Spark's type of ``node``; unknown stops the translation (``what`` names the use)."""

    def common_type(self, branches: list[exp.Expr]) -> exp.DataType | None:
        """Spark's wider type of ``branches`` (CASE, coalesce, array elements), or None."""


def unsupported(node: exp.Expr) -> str:
    """Why ``node`` stops the translation, naming it as the query wrote it."""
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}() has no Spark-equal translation"
    if isinstance(node, exp.Func):  # Spark's name, as the query wrote it
        name = node.sql("spark").split("(", 1)[0].strip().lower() or node.sql_name().lower()
        return f"function {name}() has no Spark-equal translation"
    return f"{node.key.upper()} ({node.sql('spark')[:60]!r}) has no Spark-equal translation"


def cast_to(node: exp.Expr, to: exp.DataType | str) -> exp.Cast:
    """``CAST(node AS to)``."""
    to = to if isinstance(to, exp.DataType) else exp.DataType.build(to)
    return exp.Cast(this=node, to=to.copy())


def paren(node: exp.Expr) -> exp.Expr:
    """``node``, parenthesized unless it is atomic."""
    return (
        node
        if isinstance(node, exp.Paren | exp.Column | exp.Literal | exp.Cast)
        else exp.Paren(this=node)
    )


def is_iso_date(node: exp.Expr) -> bool:
    """A string literal ``yyyy-mm-dd``: both engines read it as the same DATE."""
    return isinstance(node, exp.Literal) and node.is_string and bool(_ISO_DATE.match(node.this))
