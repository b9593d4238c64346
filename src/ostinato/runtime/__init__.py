"""The engine: device choice, one copy of weights, persistent device state, step graphs, the rung
ladder and the device loop, batch-size buckets, and the row scheduler. Nothing here knows a model."""
from .advance_clock import AdvanceClock
from .buckets import DEFAULT_BUCKETS, bucket_for, buckets_up_to
from .device import (
    default_cpu_threads, one_cpu_thread_here, parse_device, resolve_device, resolve_dtype, set_cpu_threads,
    strict_float32,
)
from .graphs import DECODE_LOOPS, StepGraph, graphs_supported, loop_rung, resolve_decode_loop
from .scheduler import RowScheduler, SlotTable, Ticket, store_at
from .state import DeviceState, concat_rows
from .uploads import host_tensor_to_device, host_values_to_device, padded_host_batch, upload_batches
from .weights import MemoryReport, duplicated_parameters, memory_report, place_module, storage_bytes

__all__ = [
    "AdvanceClock",
    "DECODE_LOOPS",
    "DEFAULT_BUCKETS",
    "DeviceState",
    "MemoryReport",
    "RowScheduler",
    "SlotTable",
    "StepGraph",
    "Ticket",
    "bucket_for",
    "buckets_up_to",
    "concat_rows",
    "default_cpu_threads",
    "duplicated_parameters",
    "graphs_supported",
    "host_tensor_to_device",
    "host_values_to_device",
    "loop_rung",
    "memory_report",
    "one_cpu_thread_here",
    "padded_host_batch",
    "parse_device",
    "place_module",
    "resolve_decode_loop",
    "resolve_device",
    "resolve_dtype",
    "set_cpu_threads",
    "storage_bytes",
    "store_at",
    "strict_float32",
    "upload_batches",
]
