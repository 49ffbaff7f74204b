#!/usr/bin/env bash
# next session's first call: tests/gpu (load.py and core/steps.py changed since f0fbb41), then
# the streamed load's cuts side by side (16K at 4 and 16 I/O threads, 64K at 4)
bash tests/gpu/l3_default_layout.sh tests > $OUT/setup.log 2>&1; tail -3 $OUT/tests_gpu.log
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=/tmp/ib/usr/lib/x86_64-linux-gnu NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
shapes() {  # tag, limit, args...
  local tag=$1 limit=$2; shift 2
  timeout $limit python3 benchmarks/group_shapes.py --out $OUT/shapes_$tag.json "$@" > $OUT/shapes_$tag.log 2>&1
  echo "$tag rc $? ${SECONDS}s"; grep " new, " $OUT/shapes_$tag.log
}
shapes 16k_t4 150 --tokens 16384 --new 128 1024 8192
shapes 16k_t16 150 --tokens 16384 --new 128 1024 8192 -- storage.io_threads=16
shapes 64k_t4 200 --tokens 65536 --new 128 1024 -- bench.repeats=2
