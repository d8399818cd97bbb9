"""Three-part names of mounted catalogs' tables in SQL text: found, and rewritten to bare names.

The coordinator plans every query over tables of DataFusion's default schema
(a table's source is found by its bare name, see
:mod:`distfusion.planner.repair_substrait`). A table of a catalog mounted with
:meth:`~distfusion.context.DistributedContext.register_catalog` is therefore
registered, when a statement names it, under one identifier holding its whole
name (``"lake.db.orders"``), and the statement is rewritten to read that::

    SELECT orders.id, lake.db.orders.total FROM lake.db.orders WHERE ...
    SELECT "orders".id, "orders".total FROM "lake.db.orders" AS "orders" WHERE ...

The text is cut with sqlglot's PostgreSQL tokenizer (as
:func:`~distfusion.coordinator.statements.split_statements` does), so names
inside strings and comments are left alone. A name is three parts
``catalog.namespace.table`` whose first part is a mounted catalog; its parts
fold to lower case unless double-quoted, as DataFusion's identifiers do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from distfusion.coordinator.ddl import fold_identifier, sql_tokens

__all__ = ["TableName", "find_names", "internal_name", "rewrite_names"]

_WORD = re.compile(r"[A-Za-z_][\w$]*")
_TABLE_CONTEXT = {TokenType.FROM, TokenType.JOIN, TokenType.COMMA}
"""Tokens after which a name is a table of a FROM clause (it gets its table part as alias)."""
_ALIAS_NEXT = {TokenType.ALIAS, TokenType.VAR, TokenType.IDENTIFIER, TokenType.L_PAREN}


@dataclass(frozen=True)
class TableName:
    """One ``catalog.namespace.table`` in a statement.

    Attributes:
        catalog, namespace, table: the parts, folded as DataFusion folds identifiers.
        start, end: the name's character span in the statement (``end`` exclusive).
        column_prefix: the name qualifies a column (``lake.db.t.x``).
        from_item: the name is an item of a FROM clause with no alias after it.
    """

    catalog: str
    namespace: str
    table: str
    start: int
    end: int
    column_prefix: bool = False
    from_item: bool = False

    @property
    def parts(self) -> tuple[str, str, str]:
        """``(catalog, namespace, table)``."""
        return self.catalog, self.namespace, self.table


def internal_name(catalog: str, namespace: str, table: str) -> str:
    """The bare name a catalog table is registered under: ``lake.db.orders`` (one identifier)."""
    return f"{catalog}.{namespace}.{table}"


def _part(tok: Token | None) -> str | None:
    """The identifier ``tok`` holds, folded; None when it is no name."""
    if tok is None:
        return None
    if tok.token_type == TokenType.IDENTIFIER:
        return tok.text
    if tok.token_type not in (TokenType.STRING, TokenType.NUMBER) and _WORD.fullmatch(tok.text):
        return fold_identifier(tok.text, quoted=False)
    return None


def find_names(sql: str, catalogs: set[str] | dict) -> list[TableName]:
    """The three-part names in ``sql`` whose first part is one of ``catalogs``, in order.

    Returns:
        One :class:`TableName` per occurrence; none when the tokenizer
        rejects ``sql`` (DataFusion then reports the error).

    Example:
        >>> [n.parts for n in find_names("SELECT * FROM lake.db.t -- lake.x.y", {"lake"})]
        [('lake', 'db', 't')]
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return []
    out = []
    i = 0
    while i + 4 < len(tokens):
        window = tokens[i : i + 5]
        catalog = _part(window[0])
        namespace, table = _part(window[2]), _part(window[4])
        if (
            catalog is not None
            and catalog in catalogs
            and window[1].token_type == TokenType.DOT
            and window[3].token_type == TokenType.DOT
            and (i == 0 or tokens[i - 1].token_type != TokenType.DOT)
            and namespace is not None
            and table is not None
        ):
            before = tokens[i - 1] if i else None
            after = tokens[i + 5] if i + 5 < len(tokens) else None
            prefix = after is not None and after.token_type == TokenType.DOT
            item = (
                not prefix
                and before is not None
                and before.token_type in _TABLE_CONTEXT
                and (after is None or after.token_type not in _ALIAS_NEXT)
            )
            name = TableName(
                catalog,
                namespace,
                table,
                window[0].start,
                window[4].end + 1,
                prefix,
                item,
            )
            out.append(name)
            i += 5
        else:
            i += 1
    return out


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def rewrite_names(sql: str, names: list[TableName]) -> str:
    """``sql`` with each of ``names`` (from :func:`find_names` on it) read as its bare name.

    A table becomes ``"catalog.namespace.table"`` (a FROM item without alias
    gets ``AS "table"``, so ``table.column`` still resolves, as DataFusion
    resolves it against a qualified table); a column's qualifier becomes
    ``"table"``.

    Example:
        >>> sql = "SELECT lake.db.t.x FROM lake.db.t"
        >>> rewrite_names(sql, find_names(sql, {"lake"}))
        'SELECT "t".x FROM "lake.db.t" AS "t"'
    """
    out = []
    at = 0
    for n in names:
        out.append(sql[at : n.start])
        if n.column_prefix:
            out.append(_quoted(n.table))
        else:
            out.append(_quoted(internal_name(*n.parts)))
            if n.from_item:
                out.append(f" AS {_quoted(n.table)}")
        at = n.end
    out.append(sql[at:])
    return "".join(out)
