"""The hashing rule of shuffles, shared by the planner and the workers.

A shuffle gives every row the partition ``pmod(xxhash64(keys), n)`` (Spark's
hash, computed on the worker by DataFusion's Spark functions, see
:func:`distfusion.worker.execute_task.partition_output`). The hash depends on
the Arrow type, so keys are hashed as :func:`hash_type` of their type; the
planner reuses a partitioning only when both sides' hash types are equal
(:mod:`distfusion.planner.distribute_joins`, co-partitioned joins).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["hash_type"]


def hash_type(dtype: pa.DataType) -> pa.DataType:
    """The type a partition key of ``dtype`` is hashed as.

    Every integer as int64, every string as utf8, every binary as binary: two
    key columns hash equal values alike only if their hash types are equal. A
    time of day is hashed as its integer value in its own unit, as ``int64``
    (Spark's ``xxhash64`` in DataFusion has no time kernel, "Unsupported data
    type in hasher"): keys of two time types meet only after DataFusion casts
    them to one type, so equal hash types imply the same unit.

    >>> hash_type(pa.int32()), hash_type(pa.large_string()), hash_type(pa.float64())
    (DataType(int64), DataType(string), DataType(double))
    >>> hash_type(pa.time32("s")), hash_type(pa.binary_view())
    (DataType(int64), DataType(binary))
    """
    if pa.types.is_integer(dtype) or pa.types.is_time(dtype):
        return pa.int64()
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    return dtype
