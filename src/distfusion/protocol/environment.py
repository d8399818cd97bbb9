"""The environment switches of distfusion, read in one place: :func:`environment_switches`.

Each switch is also a setting (a :class:`~distfusion.planner.config.DistributedConfig`
field, or a process setting): the environment variable only overrides its
default, and is read when settings are resolved, never when a module is imported
(but for the one process setting that must precede DataFusion's runtime,
:data:`STREAM_EXCHANGES_ENV`). Who calls it:

==================================  =============================================
``DISTFUSION_STREAM_TASK_INPUTS``   the coordinator when it resolves a query's
                                    settings for a runtime
                                    (``PlannerConfig.for_runtime``), for
                                    ``DistributedConfig.stream_task_inputs``
                                    left None; a worker, for a task whose plan
                                    has no opinion (``TaskPlan.stream_inputs``
                                    None: the coordinator's setting and
                                    environment said nothing)
``DISTFUSION_STREAM_EXCHANGES``     :mod:`distfusion.worker.stream_inputs` when
                                    imported: the tokio threads of
                                    datafusion-python's runtime are fixed when
                                    it starts, which may be before any
                                    distfusion object exists
==================================  =============================================

The worker's shared secret (``DISTFUSION_TOKEN``, ``DISTFUSION_WORKER_TOKEN``) is a
credential, not a switch: the transports and the worker read it where they take a
token (:data:`~distfusion.protocol.messages.TOKEN_ENV`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "STREAM_EXCHANGES_ENV",
    "STREAM_TASK_INPUTS_ENV",
    "EnvironmentSwitches",
    "environment_switches",
]

STREAM_EXCHANGES_ENV = "DISTFUSION_STREAM_EXCHANGES"
"""``1``: this process gives DataFusion's runtime the tokio threads streamed inputs need
(:data:`distfusion.worker.stream_inputs.STREAM_EXCHANGES`)."""

STREAM_TASK_INPUTS_ENV = "DISTFUSION_STREAM_TASK_INPUTS"
"""``1``: tasks on workers stream their inputs; another value: they read them whole
(``DistributedConfig.stream_task_inputs``)."""


@dataclass(frozen=True)
class EnvironmentSwitches:
    """The switches the environment sets (:func:`environment_switches`).

    Attributes:
        stream_exchanges: ``DISTFUSION_STREAM_EXCHANGES`` is ``1`` (default False).
        stream_task_inputs: ``DISTFUSION_STREAM_TASK_INPUTS``: True when ``1``,
            False when set to anything else, None when unset or empty (the
            setting's own default applies).
    """

    stream_exchanges: bool = False
    stream_task_inputs: bool | None = None


def environment_switches(environ: Mapping[str, str] | None = None) -> EnvironmentSwitches:
    """The distfusion switches of ``environ`` (default: this process's environment, now).

    The one function that reads them; see the module for who calls it and when.
    """
    env = os.environ if environ is None else environ
    task_inputs = env.get(STREAM_TASK_INPUTS_ENV, "")
    return EnvironmentSwitches(
        stream_exchanges=env.get(STREAM_EXCHANGES_ENV, "") == "1",
        stream_task_inputs=None if task_inputs == "" else task_inputs == "1",
    )
