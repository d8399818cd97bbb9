"""The coordinator <-> worker contract, in one place (see docs/architecture.md).

What crosses between the coordinator and its workers, whatever carries it
(in-process calls, Arrow Flight, Spark tasks):

=================  ============================================================
``task_plan.py``   :class:`TaskPlan` (with :class:`ScanShare`), :class:`TaskKey`
``messages.py``    action names, the partition ticket, the task request, the token
``errors.py``      the error codec: a typed error to and from a dict
``hashing.py``     the shuffle hashing rule shared by the planner and the workers
``environment.py`` the ``DISTFUSION_*`` switches, read in one function
=================  ============================================================

It depends only on the data model (:mod:`distfusion.stages`,
:mod:`distfusion.io.sources`, :mod:`distfusion.errors`); ``planner/``,
``transport/``, ``worker/`` and ``runtime/`` import it, never the other way round.
"""

from distfusion.protocol.errors import error_from_dict, error_to_dict, task_error
from distfusion.protocol.hashing import hash_type
from distfusion.protocol.task_plan import ScanShare, TaskKey, TaskPlan, task_name

__all__ = [
    "ScanShare",
    "TaskKey",
    "TaskPlan",
    "error_from_dict",
    "error_to_dict",
    "hash_type",
    "task_error",
    "task_name",
]
