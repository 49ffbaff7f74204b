"""What the CUDA calls of the issue path cost the host, and what one batched copy call costs.

Run on a cuda machine from the repository root: python3 benchmarks/probe_cuda_calls.py
(its figures on the H200: docs/benchmarks/history/2026-12-02-to-04-sessions-12-23.md,
"What one CUDA call costs the host there").
"""

import ctypes
import statistics
import time

import numpy as np
import torch

from pipeline.engine.cuda.cudart import loaded_cudart

torch.cuda.init()
dev = torch.device("cuda", 0)
stream = torch.cuda.Stream()
cudart = loaded_cudart()
ver = ctypes.c_int()
cudart.cudaRuntimeGetVersion(ctypes.byref(ver))
print("cudart version", ver.value)

L, P, W = 61, 256, 64 * 1152  # layers, pages, page bytes (deepseek_v3 at 16K)
host = torch.empty(P, L, W, dtype=torch.uint8, pin_memory=True)  # page_first_direct
host.random_(0, 255)
device = torch.zeros(L, P, W, dtype=torch.uint8, device=dev)
raw = stream.cuda_stream
vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


def bound(fn, *args):
    fn.restype = ci
    fn.argtypes = list(args)
    return fn


memcpy2d = bound(cudart.cudaMemcpy2DAsync, vp, sz, vp, sz, sz, sz, ci, vp)
memcpy = bound(cudart.cudaMemcpyAsync, vp, vp, sz, ci, vp)
h0, d0 = host.data_ptr(), device.data_ptr()


def timeit(fn, reps=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def loop_2d():
    for layer in range(L):
        memcpy2d(d0 + layer * P * W, W, h0 + layer * W, L * W, W, P, 4, raw)


def loop_1d_small():
    for layer in range(L):
        memcpy(d0 + layer * P * W, h0 + layer * W, 4096, 4, raw)


events = [torch.cuda.Event() for _ in range(L)]


def records():
    with torch.cuda.stream(stream):
        for e in events:
            e.record()


record = bound(cudart.cudaEventRecord, vp, vp)


def raw_records():
    for h in handles:
        assert record(h, raw) == 0, "cudaEventRecord failed"


def raw_streams():
    for _ in range(L):
        torch._C._cuda_getCurrentRawStream(0)


print(f"61 x cudaMemcpy2DAsync (ctypes): {timeit(loop_2d):.1f} us")
print(f"61 x cudaMemcpyAsync 4K (ctypes): {timeit(loop_1d_small):.1f} us")
print(f"61 x torch Event.record: {timeit(records):.1f} us")
records()  # torch makes its events on their first record
handles = [e.cuda_event for e in events]
print(f"61 x cudaEventRecord (ctypes): {timeit(raw_records):.1f} us")
print(f"61 x getCurrentRawStream: {timeit(raw_streams):.1f} us")

# the 2D loop's GPU time and bytes
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record(stream)
loop_2d()
end.record(stream)
end.synchronize()
print(f"2D loop GPU {start.elapsed_time(end):.2f} ms for {L * P * W / 1e9:.2f} GB")
assert torch.equal(device.cpu(), host.transpose(0, 1)), "2D loop moved the wrong bytes"


# one 2D copy per layer (as the direct path issues them), as 112-byte cudaMemcpy3DBatchOp
OP = np.dtype(
    [
        ("st", "<i4"),
        ("sp0", "<i4"),
        ("sptr", "<u8"),
        ("srow", "<u8"),
        ("slayer", "<u8"),
        ("sloc", "<u8"),
        ("dt", "<i4"),
        ("dp0", "<i4"),
        ("dptr", "<u8"),
        ("drow", "<u8"),
        ("dlayer", "<u8"),
        ("dloc", "<u8"),
        ("w", "<u8"),
        ("h", "<u8"),
        ("d", "<u8"),
        ("order", "<i4"),
        ("flags", "<u4"),
    ]
)
assert OP.itemsize == 112


def table(n_layers, pages):
    ops = np.zeros(n_layers, OP)
    ops["st"] = ops["dt"] = 1
    ops["sptr"] = h0 + np.arange(n_layers, dtype=np.uint64) * W
    ops["srow"] = L * W
    ops["slayer"] = pages
    ops["dptr"] = d0 + np.arange(n_layers, dtype=np.uint64) * P * W
    ops["drow"] = W
    ops["dlayer"] = pages
    ops["w"], ops["h"], ops["d"], ops["order"] = W, pages, 1, 1
    return ops


# CUDA 13's signature (12.8's has a size_t* failIdx before the flags)
fn = cudart.cudaMemcpy3DBatchAsync
fn.argtypes = [sz, vp, ctypes.c_ulonglong, vp]
fn.restype = ci
variant = "cudaMemcpy3DBatchAsync"


def call(ops):
    return fn(len(ops), ops.ctypes.data, 0, raw)


device.zero_()
torch.cuda.synchronize()
ops = table(L, P)
err = call(ops)
torch.cuda.synchronize()
print(
    variant,
    "error",
    err,
    "bit-exact",
    bool(err == 0 and torch.equal(device.cpu(), host.transpose(0, 1))),
)
if err:
    raise SystemExit(f"cudaMemcpy3DBatchAsync failed with CUDA error {err}")

print(f"{variant}: 61 x 2D ops of 256 pages, one call: {timeit(lambda: call(ops)):.1f} us")
small = table(4, P)
print(f"{variant}: 4 ops, one call: {timeit(lambda: call(small)):.1f} us")
print(f"{variant}: build a 61-op table: {timeit(lambda: table(L, P)):.1f} us")
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record(stream)
call(ops)
e.record(stream)
e.synchronize()
print(f"{variant}: GPU {s.elapsed_time(e):.2f} ms for {L * P * W / 1e9:.2f} GB")
