#!/usr/bin/env bash
# diagnosis 2: the file store's streamed TTFT timeline at 1K new tokens (4 and 16 I/O threads),
# write phases with the engine's write-back, ttft 16K file rows at 16 I/O threads
bash tests/gpu/l3_default_layout.sh > $OUT/setup.log 2>&1
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=/tmp/ib/usr/lib/x86_64-linux-gnu NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cat $OUT/gpu.txt
for t in 4 16; do
  mkdir -p /tmp/tl$t
  timeout 150 python3 benchmarks/ttft_timeline.py --tokens 16384 --new 1024 --out $OUT/tl_file_t$t.json -- storage=file storage.path=/tmp/tl$t storage.io_threads=$t workload.host_ratio=0.5 strategy.keep_capacity=true > $OUT/tl_file_t$t.log 2>&1; echo "rc $? ${SECONDS}s"
  grep -v "^\[\|^[IW]1\|WARN" $OUT/tl_file_t$t.log | tail -16
done
timeout 120 python3 benchmarks/write_phases.py --pages 256 --threads 4 16 --override topology.device=cuda --json $OUT/writes.json > $OUT/writes.log 2>&1; echo "rc $? ${SECONDS}s"
cat $OUT/writes.log
timeout 150 python3 -m pipeline bench model=deepseek_v3 topology=tp1 topology.device=cuda 'bench.strategies=[replicated]' runtime.timeout_s=180 bench.out_dir=$OUT/ttft_16k_file_t16 bench=ttft 'bench.sizes=[16384]' 'bench.stores=[file]' storage.io_threads=16 > $OUT/ttft_16k_file_t16.log 2>&1; echo "rc $? ${SECONDS}s"
grep -E '^\|' $OUT/ttft_16k_file_t16.log | tail -5
