"""The CUDA runtime calls the issue path makes, bound once through ctypes.

Torch's wrappers around an event add a Python object and its calls to each (BENCHMARKS.md,
issue time), and a transfer records one or two per layer. This is the libcudart torch loaded:
the same context, streams and graph captures.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

CUDA_ERROR_NOT_READY = 600
EVENT_DISABLE_TIMING = 2
"""cudaEventDisableTiming: as torch's default events (no timestamps to take)."""
EVENT_RECORD_EXTERNAL = 1
"""cudaEventRecordExternal: inside a graph capture, an event node others may wait on."""
SPARE_EVENTS = 4096
"""Most released events kept for reuse (a transfer takes one or two per layer)."""


def loaded_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library torch already loaded (same instance, same context), if any."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    return ctypes.CDLL(sorted(paths)[0]) if paths else None


def cuda_runtime(device: torch.device) -> ctypes.CDLL | None:
    """torch's libcudart for a cuda device (None on CPU), whose calls the copies and events
    make; RuntimeError where torch has not loaded one."""
    if device.type != "cuda":
        return None
    torch.cuda.init()  # loads it
    lib = loaded_cudart()
    if lib is None:
        raise RuntimeError(
            "torch's CUDA runtime (libcudart.so) is not loaded in this process: the cuda copy "
            "and event calls go through it (a torch build with CUDA loads it on first use)"
        )
    return lib


def bound(fn: Any, *argtypes: Any) -> Any:
    """A cudart function with its argument types declared; it returns the cudaError_t."""
    fn.restype = ctypes.c_int
    fn.argtypes = list(argtypes)
    return fn


class Cudart:
    """Event calls of one process's CUDA runtime (events are plain integer handles).

    Events released by their owners are kept and handed out again: creating one costs the
    host several times what recording it does, and every transfer takes one or two per layer.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, flags = ctypes.c_void_p, ctypes.c_uint
        self._create = bound(lib.cudaEventCreateWithFlags, ctypes.POINTER(ptr), flags)
        self._record = bound(lib.cudaEventRecordWithFlags, ptr, ptr, flags)
        self._query = bound(lib.cudaEventQuery, ptr)
        self._wait = bound(lib.cudaStreamWaitEvent, ptr, ptr, flags)
        self._destroy = bound(lib.cudaEventDestroy, ptr)
        self._last_error = bound(lib.cudaGetLastError)
        self._error_string = lib.cudaGetErrorString
        self._error_string.restype = ctypes.c_char_p
        self._error_string.argtypes = [ctypes.c_int]
        self._spare: list[int] = []
        """Released events no one holds, reused before new ones are made."""

    def check(self, error: int, call: str) -> None:
        if error:
            text = self._error_string(error).decode()
            raise RuntimeError(f"{call} failed with CUDA error {error}: {text}")

    def new_event(self) -> int:
        if self._spare:  # a pending record on it is superseded by the next one (CUDA's rule)
            return self._spare.pop()
        handle = ctypes.c_void_p()
        self.check(self._create(ctypes.byref(handle), EVENT_DISABLE_TIMING), "cudaEventCreate")
        assert handle.value is not None, "cudaEventCreate made no event"
        return handle.value

    # record and wait check inline: `check` is one more Python call, and every layer of
    # every transfer records or waits
    def record(self, event: int, stream: int, *, external: bool) -> None:
        error = self._record(event, stream, EVENT_RECORD_EXTERNAL if external else 0)
        if error:
            self.check(error, "cudaEventRecord")

    def wait(self, stream: int, event: int) -> None:
        error = self._wait(stream, event, 0)
        if error:
            self.check(error, "cudaStreamWaitEvent")

    def query(self, event: int) -> bool:
        error = self._query(event)
        if error == CUDA_ERROR_NOT_READY:
            # not an error, but the runtime keeps it as the last one: cleared (as torch does),
            # or torch's next kernel launch check would raise it
            self._last_error()
            return False
        if error:
            self.check(error, "cudaEventQuery")
        return True

    def __del__(self) -> None:
        # no event holds this runtime any longer (each keeps a reference): the spares go
        for event in self._spare:
            self._destroy(event)

    def release(self, event: int) -> None:
        """An event its owner no longer holds: kept for reuse, or destroyed beyond the spares
        (once it completes, if still pending; errors at exit are moot)."""
        if len(self._spare) < SPARE_EVENTS:
            self._spare.append(event)
        else:
            self._destroy(event)
