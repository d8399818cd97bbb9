"""What a DDL or DML statement does to the tables distfusion distributes.

DataFusion runs DDL itself (``CREATE TABLE``, ``CREATE VIEW``, ``CREATE
EXTERNAL TABLE``, ``DROP``) as :meth:`SessionContext.sql` plans it, and DML
(``INSERT INTO``, ``COPY``) when its DataFrame is collected. distfusion keeps a
:class:`~distfusion.io.sources.TableSource` for every table it splits across tasks,
so it needs to know, before and after DataFusion acts, which statements create
or change a table. :func:`parse_statement` reads that from the statement's
tokens (sqlglot's PostgreSQL tokenizer, as :func:`split_statements`); DataFusion
still parses and checks every statement itself, and its errors are its own.

========================================  ====================================
statement                                 what distfusion does
========================================  ====================================
``CREATE [OR REPLACE] TABLE t AS query``  runs ``query`` distributed, then has
(also ``AS VALUES``)                      DataFusion create ``t`` from the
                                          result; ``t`` is a memory table
``CREATE TABLE t (columns)``              a memory table (empty)
``CREATE EXTERNAL TABLE t STORED AS       a Parquet source: its files are work
PARQUET [PARTITIONED BY (cols)]           units, as ``register_parquet`` (with
LOCATION 'dir'``                          ``table_partition_cols``)
other external tables (CSV, JSON,         read by DataFusion on the
remote)                                   coordinator (no source)
``INSERT INTO t ...``, ``UPDATE``,        run by DataFusion on the coordinator;
``DELETE``                                memory tables are read again after
``DROP TABLE t``                          the source is dropped
========================================  ====================================
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

__all__ = ["Statement", "parse_statement", "fold_identifier", "sql_tokens"]

_POSTGRES = Postgres()


@functools.lru_cache(maxsize=64)
def sql_tokens(sql: str) -> tuple[Token, ...]:
    """``sql`` tokenized by sqlglot's PostgreSQL tokenizer, kept for the texts seen last.

    A query's text is tokenized to split its statements and again to classify
    each one (about 1 ms each for a TPC-H query): the second time, and every
    time the same text is planned again, costs nothing. The tokens are
    sqlglot's (not to be changed).

    Raises:
        TokenError: an unterminated string or comment (not kept).
    """
    return tuple(_POSTGRES.tokenize(sql))


def fold_identifier(text: str, quoted: bool) -> str:
    """An identifier as DataFusion resolves it: unquoted folds to lower case, quoted is kept."""
    return text if quoted else text.lower()


@dataclass(frozen=True)
class Statement:
    """What :func:`parse_statement` found.

    Attributes:
        kind: ``"ctas"`` (``CREATE TABLE ... AS query``), ``"create"`` (a
            table from column definitions), ``"external"``, ``"dml"``
            (``INSERT``, ``UPDATE``, ``DELETE``), ``"view"`` (``CREATE [OR
            REPLACE] VIEW``), or ``"other"``.
        table: the table created or changed, as DataFusion names it (last
            part of a dotted name), or ``""``.
        schema_qualified: the table name has a schema or catalog part.
        head: for ``ctas``, the statement's text before ``AS``.
        query: for ``ctas``, the query's text after ``AS``.
        stored_as: for ``external``, the format in upper case (``"PARQUET"``).
        location: for ``external``, the ``LOCATION`` string.
        partitioned: for ``external``, it has ``PARTITIONED BY``.
        partition_cols: for ``external``, the ``PARTITIONED BY`` columns, folded.
        options: for ``external``, it has an ``OPTIONS (...)`` clause.
    """

    kind: str
    table: str = ""
    schema_qualified: bool = False
    head: str = ""
    query: str = ""
    stored_as: str = ""
    location: str = ""
    partitioned: bool = False
    partition_cols: tuple[str, ...] = ()
    options: bool = False


def _name(tokens: tuple[Token, ...], i: int) -> tuple[str, bool, int]:
    """The dotted name starting at ``tokens[i]``: (last part folded, qualified, next index)."""
    parts = []
    while i < len(tokens):
        tok = tokens[i]
        parts.append(fold_identifier(tok.text, tok.token_type == TokenType.IDENTIFIER))
        i += 1
        if i < len(tokens) and tokens[i].token_type == TokenType.DOT:
            i += 1
            continue
        break
    return (parts[-1] if parts else ""), len(parts) > 1, i


def _partition_cols(tokens: tuple[Token, ...]) -> tuple[str, ...]:
    """The column names of ``PARTITIONED BY (a, b TYPE, ...)``, folded; ``()`` without one."""
    at = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.PARTITION_BY), None)
    if at is None or at + 1 >= len(tokens) or tokens[at + 1].token_type != TokenType.L_PAREN:
        return ()
    names, depth, expect = [], 0, True
    for tok in tokens[at + 1 :]:
        tt = tok.token_type
        depth += (tt == TokenType.L_PAREN) - (tt == TokenType.R_PAREN)
        if depth == 0:
            break
        if depth == 1 and tt == TokenType.COMMA:
            expect = True
        elif expect and depth == 1 and tt != TokenType.L_PAREN:
            names.append(fold_identifier(tok.text, tt == TokenType.IDENTIFIER))
            expect = False
    return tuple(names)


def parse_statement(sql: str) -> Statement:
    """Classify one SQL statement (see the module docs); never raises.

    Text the tokenizer rejects is ``"other"`` (DataFusion reports the error).
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return Statement("other")
    if not tokens:
        return Statement("other")
    words = [t.text.upper() for t in tokens]
    first = tokens[0].token_type
    if first in (TokenType.INSERT, TokenType.UPDATE, TokenType.DELETE):
        i = 1
        while i < len(tokens) and words[i] in ("INTO", "FROM", "OVERWRITE", "TABLE"):
            i += 1
        name, qualified, _ = _name(tokens, i)
        return Statement("dml", name, qualified)
    if first == TokenType.CREATE and "VIEW" in words[1:4] and "TABLE" not in words[:6]:
        i = words.index("VIEW") + 1
        if words[i : i + 3] == ["IF", "NOT", "EXISTS"]:
            i += 3
        name, qualified, _ = _name(tokens, i)
        return Statement("view", name, qualified)
    if first != TokenType.CREATE or "TABLE" not in words[:6]:
        return Statement("other")
    table_at = words.index("TABLE")
    modifiers = set(words[1:table_at])
    if not modifiers <= {"OR", "REPLACE", "TEMPORARY", "TEMP", "EXTERNAL", "UNBOUNDED"}:
        return Statement("other")
    i = table_at + 1
    if words[i : i + 3] == ["IF", "NOT", "EXISTS"]:
        i += 3
    name, qualified, i = _name(tokens, i)
    if "EXTERNAL" in modifiers:
        stored_as = location = ""
        for j, w in enumerate(words[:-1]):
            if w == "STORED" and words[j + 1] == "AS" and j + 2 < len(words):
                stored_as = words[j + 2]
            if w == "LOCATION" and tokens[j + 1].token_type == TokenType.STRING:
                location = tokens[j + 1].text
        return Statement(
            "external",
            name,
            qualified,
            stored_as=stored_as,
            location=location,
            partitioned=any(t.token_type == TokenType.PARTITION_BY for t in tokens),
            partition_cols=_partition_cols(tokens),
            options="OPTIONS" in words,
        )
    depth = 0
    for j in range(i, len(tokens)):
        tt = tokens[j].token_type
        depth += (tt == TokenType.L_PAREN) - (tt == TokenType.R_PAREN)
        if depth == 0 and tt == TokenType.ALIAS and j + 1 < len(tokens):
            head = sql[: tokens[j].start]
            return Statement("ctas", name, qualified, head=head, query=sql[tokens[j + 1].start :])
    return Statement("create", name, qualified)
