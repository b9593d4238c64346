"""The engine: device choice, one copy of weights, persistent device state, step graphs."""
from .device import resolve_device, resolve_dtype, strict_float32
from .graphs import DEFAULT_BUCKETS, StepGraph, bucket_for, graphs_supported, loop_rung
from .state import DeviceState
from .weights import MemoryReport, duplicated_parameters, memory_report, place_module, storage_bytes

__all__ = [
    "DEFAULT_BUCKETS",
    "DeviceState",
    "MemoryReport",
    "StepGraph",
    "bucket_for",
    "duplicated_parameters",
    "graphs_supported",
    "loop_rung",
    "memory_report",
    "place_module",
    "resolve_device",
    "resolve_dtype",
    "storage_bytes",
    "strict_float32",
]
