"""Helpers over Substrait plans, shared by the planner and the workers.

Below both :mod:`distfusion.planner` and :mod:`distfusion.worker` (the
import-linter layers in pyproject.toml): a worker decodes and walks its
fragment with these, it never imports the planner (a contract in pyproject.toml
fails when it does). Five modules, each importing only those before it:
:mod:`~distfusion.substrait_plan.walk` (the one relation walker),
:mod:`~distfusion.substrait_plan.functions` (the datafusion-spark functions a
plan may name, registered where it is decoded),
:mod:`~distfusion.substrait_plan.build` (reading and building relations and
expressions), :mod:`~distfusion.substrait_plan.decode` (a plan's bytes to a
DataFusion logical plan, however deep it nests) and
:mod:`~distfusion.substrait_plan.rewrite` (``SchemaOracle``: types from
DataFusion; ``RelRewrite``: the base of the planner's rewrites; coordinator only).

Named ``substrait_plan``, not ``substrait``: ``substrait`` is the import name of
the PyPI package of typed protobuf classes (``substrait.proto``) that every module
here imports, and one name for both would make each such import a puzzle.

Importing any module of this package lifts the protobuf parser's nesting limit
for the process (:func:`_allow_deep_messages`).
"""

from __future__ import annotations

import importlib

from google.protobuf.internal import api_implementation

# protobuf's implementation -> its native module with SetAllowOversizeProtos.
_PROTOBUF_RUNTIMES = {"upb": "google._upb._message", "cpp": "google.protobuf.pyext._message"}


def _allow_deep_messages() -> None:
    """Lift the Python protobuf parser's nesting limit (100) for this process.

    A plan DataFusion accepts may nest deeper than 100 messages (a 40-table
    join nests hundreds of levels deep), and the upb runtime re-parses a message on
    ``CopyFrom``. ``SetAllowOversizeProtos`` is upb's switch for this (its
    limit becomes 65535). The pure-Python parser has no such limit; the C++ one
    has the same switch.
    """
    runtime = _PROTOBUF_RUNTIMES.get(api_implementation.Type())
    if runtime is not None:  # loaded already: it is the runtime protobuf uses
        importlib.import_module(runtime).SetAllowOversizeProtos(True)


_allow_deep_messages()
