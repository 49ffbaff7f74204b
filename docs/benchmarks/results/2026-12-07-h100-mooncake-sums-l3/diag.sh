#!/usr/bin/env bash
# diagnosis: Mooncake gets on this host, TTFT timelines (file store, host tier), write phases
bash tests/gpu/l3_default_layout.sh > $OUT/setup.log 2>&1
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=/tmp/ib/usr/lib/x86_64-linux-gnu NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cat $OUT/gpu.txt; nproc
for p in 8; do timeout 150 python3 .whl/mc_par.py 256 8 $p 2>&1 | grep -v "^[IWE]1" | tee $OUT/mc_$p.log; done
for t in 4 16; do timeout 100 python3 .whl/mc_shape.py 256 64 $t 2>&1 | grep -v "^[IWE]1" | tee $OUT/mc_shape_$t.log; done
echo "mc done ${SECONDS}s"
timeout 200 python3 benchmarks/ttft_timeline.py --tokens 16384 --new 128 1024 --out $OUT/tl_file.json -- storage=file workload.host_ratio=0.5 strategy.keep_capacity=true > $OUT/tl_file.log 2>&1; echo "rc $? ${SECONDS}s"
grep -v "^[IW]1" $OUT/tl_file.log | tail -60
timeout 100 python3 benchmarks/ttft_timeline.py --tokens 16384 --new 128 --out $OUT/tl_host.json > $OUT/tl_host.log 2>&1; echo "rc $? ${SECONDS}s"
tail -14 $OUT/tl_host.log
timeout 100 python3 benchmarks/write_phases.py --pages 256 --threads 4 16 --override topology.device=cuda --json $OUT/writes.json > $OUT/writes.log 2>&1; echo "rc $? ${SECONDS}s"
cat $OUT/writes.log
bash tests/gpu/l3_default_layout.sh l3 ttft16 | grep -v "^+"; echo "all ${SECONDS}s"
