"""The relation walker: the one walk over Substrait protobuf relations and expressions.

A relation's kind (:func:`rel_kind`) and its inputs (:func:`children`,
:func:`set_children`, and :func:`relations` for the whole tree) come from one
table of child fields. Every search of a
plan goes through :func:`walk`: it yields a protobuf message and every message
nested in it (expressions, nested relations, subqueries), depth first in field
order, and stops descending where the caller says. :func:`own_messages` is the
same walk over a relation's own fields (its expressions), not its inputs.
:func:`find` is the walk for messages of one type: it descends only into fields
whose type can hold one (not into types, literals or schemas), which makes the
searches for reads, subqueries and window functions several times cheaper. The
searches the planner needs (:func:`contains`, :func:`own_contains`,
:func:`own_subqueries`, :func:`source_tables`, :func:`field_refs`) are built on
them. See docs/architecture.md (the planner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import TypeVar

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from substrait.proto import Expression, Rel

from distfusion.errors import PlanningError

T = TypeVar("T", bound=Message)

__all__ = [
    "child_fields",
    "children",
    "contains",
    "field_refs",
    "find",
    "is_subquery",
    "has_subquery",
    "own_contains",
    "own_find",
    "own_has_subquery",
    "own_messages",
    "own_subqueries",
    "read_rels",
    "rel_kind",
    "relations",
    "root_field_refs",
    "set_children",
    "source_tables",
    "walk",
]

# Relation kind -> its child fields: a tuple of singular fields, or the name of a
# repeated field.
_CHILD_FIELDS: dict[str, tuple[str, ...] | str] = {
    "read": (),
    "filter": ("input",),
    "fetch": ("input",),
    "aggregate": ("input",),
    "sort": ("input",),
    "project": ("input",),
    "join": ("left", "right"),
    "cross": ("left", "right"),
    "set": "inputs",
    "extension_single": ("input",),
    "extension_multi": "inputs",
    "extension_leaf": (),
    "window": ("input",),
    "exchange": ("input",),
    "expand": ("input",),
    "hash_join": ("left", "right"),
    "merge_join": ("left", "right"),
    "nested_loop_join": ("left", "right"),
}


def rel_kind(rel: Rel) -> str:
    """The relation's kind, the name of the set ``rel_type`` field (``"join"``, ...)."""
    kind = rel.WhichOneof("rel_type")
    if kind is None:
        raise PlanningError("Substrait relation has no rel_type")
    return kind


def child_fields(kind: str) -> set[str]:
    """Names of the fields of a ``kind`` relation's body that hold its input relations."""
    spec = _CHILD_FIELDS.get(kind, ())
    return {spec} if isinstance(spec, str) else set(spec)


def children(rel: Rel) -> list[Rel]:
    """The input relations of ``rel``, left to right (empty for leaves)."""
    kind = rel_kind(rel)
    body = getattr(rel, kind)
    spec = _CHILD_FIELDS.get(kind, ())
    if isinstance(spec, str):
        return list(getattr(body, spec))
    return [getattr(body, f) for f in spec if body.HasField(f)]


def set_children(rel: Rel, new_children: list[Rel]) -> Rel:
    """A copy of ``rel`` whose inputs are ``new_children`` (same count and order)."""
    out = Rel()
    out.CopyFrom(rel)
    kind = rel_kind(out)
    body = getattr(out, kind)
    spec = _CHILD_FIELDS.get(kind, ())
    if isinstance(spec, str):
        field = getattr(body, spec)
        del field[:]
        for c in new_children:
            field.add().CopyFrom(c)
    else:
        present = [f for f in spec if body.HasField(f)]
        assert len(present) == len(new_children), (kind, present, len(new_children))
        for f, c in zip(present, new_children, strict=True):
            getattr(body, f).CopyFrom(c)
    return out


def relations(rel: Rel) -> Iterator[Rel]:
    """``rel`` and the relations below it through their inputs, pre-order, left to right.

    Relations inside subquery expressions are not reached (see :func:`walk`).
    """
    yield rel
    for child in children(rel):
        yield from relations(child)


def walk(msg: Message, stop: Callable[[Message], bool] | None = None) -> Iterator[Message]:
    """``msg`` and every protobuf message nested in it, depth first in field order.

    A message for which ``stop`` is true is yielded but not descended into.
    A message's fields are read when the walk descends into it, so a caller
    may change a message it was given (not its ancestors) as it goes.
    """
    # A stack, not recursion: nested generators pass every message up through
    # each level, which made walking cost most of the planning time.
    stack = [msg]
    while stack:
        m = stack.pop()
        yield m
        if stop is not None and stop(m):
            continue
        nested: list[Message] = []
        for fd, value in m.ListFields():
            if fd.message_type is None:
                continue
            if fd.is_repeated:
                nested.extend(value)
            else:
                nested.append(value)
        stack.extend(reversed(nested))


@cache
def _fields_toward(root: Descriptor, target: Descriptor) -> dict[str, frozenset[int]]:
    """For every message type nested in ``root``: its fields that can hold a ``target``.

    Keyed by the type's full name; a field is listed when its type is
    ``target`` or has a field listed (the types of a Substrait plan nest
    recursively, so this is a fixed point over the types reachable from ``root``).
    """
    edges: dict[str, list[tuple[int, str]]] = {}
    stack = [root]
    while stack:
        d = stack.pop()
        if d.full_name in edges:
            continue
        nested = [f for f in d.fields if f.message_type is not None]
        edges[d.full_name] = [(f.number, f.message_type.full_name) for f in nested]
        stack.extend(f.message_type for f in nested)
    holds = {target.full_name}
    grew = True
    while grew:
        grew = False
        for name, fields in edges.items():
            if name not in holds and any(t in holds for _, t in fields):
                holds.add(name)
                grew = True
    return {name: frozenset(n for n, t in fields if t in holds) for name, fields in edges.items()}


def find(msg: Message, cls: type[T], outermost: bool = False) -> Iterator[T]:
    """Every message of type ``cls`` in ``msg`` (``msg`` included), in :func:`walk`'s order.

    Descends only into fields whose type can hold a ``cls``. With
    ``outermost``, a found message is not descended into. The caller may
    change a message it was given, as with :func:`walk`.
    """
    toward = _fields_toward(msg.DESCRIPTOR, cls.DESCRIPTOR)
    stack = [msg]
    while stack:
        m = stack.pop()
        if isinstance(m, cls):
            yield m
            if outermost:
                continue
        fields = toward[m.DESCRIPTOR.full_name]
        if not fields:
            continue
        nested: list[Message] = []
        for fd, value in m.ListFields():
            if fd.number in fields:
                if fd.is_repeated:
                    nested.extend(value)
                else:
                    nested.append(value)
        stack.extend(reversed(nested))


def read_rels(msg: Message) -> Iterator[Rel]:
    """Every read relation in ``msg`` (``msg`` included, subqueries too), in walk order."""
    for m in find(msg, Rel):
        if m.WhichOneof("rel_type") == "read":
            yield m


def _own_fields(rel: Rel) -> Iterator[Message]:
    """The messages in ``rel``'s own fields (its expressions, ...), not its inputs."""
    kind = rel_kind(rel)
    inputs = child_fields(kind)
    for fd, value in getattr(rel, kind).ListFields():
        if fd.name in inputs or fd.message_type is None:
            continue
        yield from value if fd.is_repeated else [value]


def own_messages(rel: Rel, stop: Callable[[Message], bool] | None = None) -> Iterator[Message]:
    """:func:`walk` over ``rel``'s own fields (its expressions), not its inputs."""
    for v in _own_fields(rel):
        yield from walk(v, stop)


def own_find(rel: Rel, cls: type[T], outermost: bool = False) -> Iterator[T]:
    """:func:`find` over ``rel``'s own fields (its expressions), not its inputs."""
    for v in _own_fields(rel):
        yield from find(v, cls, outermost)


def contains(msg: Message, predicate: Callable[[Message], bool]) -> bool:
    """True if ``predicate(m)`` holds for ``msg`` or any message nested in it."""
    return any(predicate(m) for m in walk(msg))


def own_contains(rel: Rel, predicate: Callable[[Message], bool]) -> bool:
    """:func:`contains` over ``rel``'s own fields (its expressions), not its inputs."""
    return any(predicate(m) for m in own_messages(rel))


def is_subquery(m: Message) -> bool:
    """Whether protobuf message ``m`` is a subquery expression (a :func:`contains` predicate)."""
    return isinstance(m, Expression.Subquery)


def own_subqueries(rel: Rel) -> list[Expression.Subquery]:
    """The subquery expressions of ``rel``'s own expressions, outermost only."""
    return list(own_find(rel, Expression.Subquery, outermost=True))


def has_subquery(msg: Message) -> bool:
    """Whether ``msg`` is or holds a subquery expression."""
    return next(find(msg, Expression.Subquery, outermost=True), None) is not None


def own_has_subquery(rel: Rel) -> bool:
    """Whether ``rel``'s own expressions (not its inputs) hold a subquery expression."""
    return next(own_find(rel, Expression.Subquery, outermost=True), None) is not None


def source_tables(rel: Rel, names) -> list[str]:
    """Tables among ``names`` that ``rel`` reads anywhere (subqueries included), in order."""
    found: list[str] = []
    for m in read_rels(rel):
        t = m.read.named_table.names
        if len(t) and t[-1] in names and t[-1] not in found:
            found.append(t[-1])
    return found


def _scope_ends(m: Message) -> bool:
    # A field reference has no nested reference of this scope; a nested
    # relation or a subquery has references of its own scope.
    return isinstance(m, Expression.FieldReference | Rel | Expression.Subquery)


def root_field_refs(msg: Message) -> Iterator[Expression.ReferenceSegment.StructField]:
    """The struct field of every root-level field reference in ``msg``.

    Does not descend into subqueries (their references have their own scope) or
    into nested relations. The caller may change the fields it is given.
    """
    for m in walk(msg, stop=_scope_ends):
        if (
            isinstance(m, Expression.FieldReference)
            and m.HasField("root_reference")
            and m.direct_reference.HasField("struct_field")
        ):
            yield m.direct_reference.struct_field


def field_refs(expr: Message) -> set[int]:
    """The input column indices ``expr`` reads (root references only)."""
    return {sf.field for sf in root_field_refs(expr)}
