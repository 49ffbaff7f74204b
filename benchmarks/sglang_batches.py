"""SGLang's HiCache storage calls on this project's backend, as a whole process, for
`farm-bench` before/after pairs on this machine.

A host pool of SGLang's buffer shapes (`tests/sglangfns.py`: deepseek_v3's, 61 layers of
64-token pages of 576 bf16 a row) built through SGLang's own `StorageBackendFactory`, then
`--rounds` times: `batch_set_v1` of N pages into an empty file store and `batch_get_v1` of
them back into other pages, checked bit-exact once. Prints each call's best time. From the
root:
    farm-bench -n 5 --vs 'sh -c "cd /tmp/base && python benchmarks/sglang_batches.py"' \
        -- python benchmarks/sglang_batches.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sglangfns import built, host_pool, slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layout", default="page_first_direct")
    parser.add_argument("--io-threads", type=int, default=4)
    args = parser.parse_args()
    n, size = args.pages, 64
    pool = host_pool(args.layout, True, page_num=2 * n, page_size=size, layer_num=61)
    pool.kv_cache_dim = 576
    pool.__post_init__()  # the buffer at deepseek_v3's row
    pool.fill(seed=1)
    hashes = [f"{i:064x}" for i in range(1, n + 1)]
    source, target = list(range(n)), list(range(n, 2 * n))
    with tempfile.TemporaryDirectory(prefix="sglang-batches-", dir="/var/tmp") as folder:
        storage = {"kind": "file", "path": f"{folder}/l3", "io_threads": args.io_threads}
        config = {
            "backend_name": "hicache-pipeline",
            "module_path": "pipeline.integrations.sglang",
            "class_name": "PipelineStorage",
            "interface_v1": 1,
            "storage": storage,
        }
        backend = built(config, pool)
        times: dict[str, list[float]] = {"batch_set_v1": [], "batch_get_v1": []}
        try:
            for _ in range(args.rounds):
                shutil.rmtree(f"{folder}/l3/{backend.io.space}", ignore_errors=True)
                began = time.perf_counter()
                assert backend.batch_set_v1(hashes, slots(source, size)) == [True] * n
                times["batch_set_v1"].append(time.perf_counter() - began)
                began = time.perf_counter()
                assert backend.batch_get_v1(hashes, slots(target, size)) == [True] * n
                times["batch_get_v1"].append(time.perf_counter() - began)
            for s, t in zip(source, target, strict=True):
                assert torch.equal(pool.layer_rows(s), pool.layer_rows(t)), "not bit-exact"
        finally:
            backend.close()
    gb = n * pool.layer_rows(0).numel() / 1e9
    for call, seconds in times.items():
        best = min(seconds)
        print(f"{call}: best {best * 1e3:.1f} ms ({gb / best:.2f} GB/s) of {n} pages")


if __name__ == "__main__":
    main()
