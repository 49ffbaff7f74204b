"""The CUDA-specific parts: the calls that move pages and order work on a device, each with the
CPU stand-in the tests and CPU runs use.

`cudart` binds the CUDA runtime calls of the issue path once (ctypes); `streams` holds the
Event/Stream protocols, CUDA streams and the worker threads that stand in for them; a copy call
is `memcpy` (one DMA per run of pages), `memcpy_batch` (a run of every stacked unit in one
call) or `page_kernel` (pages gathered and scattered by id in one launch); `stacks` makes the
stacked views and the integers those calls take; `page_ids` lends the device buffers a
transfer's page ids go into.
"""
