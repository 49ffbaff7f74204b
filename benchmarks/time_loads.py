"""Loads from L3 as a whole process, for `farm-bench` before/after pairs on this machine.

N page objects of deepseek_v3 written to a file store (as `probe_reads.py` makes them), then
loaded into free host pages and the device tier `--loads` times with the engine's own
`load_from_l3`, on defaults or with `--override` config overrides. From the root:
    farm-bench -n 5 --timeout 600 \
        --vs 'python benchmarks/time_loads.py --override topology.mem_layout=page_first' \
        -- python benchmarks/time_loads.py
"""

from __future__ import annotations

import argparse
import tempfile

import torch.distributed as dist
from probe_reads import SIZES, Probe, load_from_l3, probe_args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=SIZES["pages"])
    parser.add_argument("--threads", type=int, default=4, help="storage.io_threads")
    parser.add_argument("--loads", type=int, default=30)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides")
    args = parser.parse_args()
    arguments = probe_args(args.pages, args.override)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory(prefix="time-loads-") as folder:
        probe = Probe(arguments, args.threads, folder, {})
        (share,) = probe.shares(1, 1)
        try:
            for _ in range(args.loads):
                load_from_l3(probe, share)
        finally:
            probe.engine.close()


if __name__ == "__main__":
    main()
