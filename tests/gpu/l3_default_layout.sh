#!/usr/bin/env bash
# The default host layout's L3 loads on the GPU host, before and after its native row reads:
# `bash run.sh new` (tests/gpu, then bench=l3 on this tree), `bash run.sh old` (the same bench
# on .old/, a `git archive` of the commit before), `bash run.sh quick` (this tree's bench only). Logs and bench JSON under $OUT.
set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
build() {
    ln -sfn ../conf "$1/pipeline/conf"
    gcc -O2 -pthread -shared -fPIC -I"$inc" "$1/pipeline/engine/l3/stores/_fileio.c" \
        -o "$1/pipeline/engine/l3/stores/_fileio.cpython-312-x86_64-linux-gnu.so"
}
bench() {  # tree, label, overrides...
    local tree=$1 label=$2
    shift 2
    for t in 4 16; do
        (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout 280 python3 -m pipeline bench bench=l3 \
            model=deepseek_v3 topology=tp1 topology.device=cuda 'bench.strategies=[replicated]' \
            'bench.stores=[file]' 'bench.sizes=[16384]' runtime.timeout_s=180 \
            storage.io_threads=$t bench.out_dir=$OUT/l3_${label}_t$t "$@" \
            >"$OUT/l3_${label}_t$t.log" 2>&1)
        tail -25 "$OUT/l3_${label}_t$t.log"
    done
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
quick)  # this tree's default-config loads only (what a short device budget allows)
    build .
    bench . default
    ;;
new)
    build .
    PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -o addopts="" -q -p no:cacheprovider \
        tests/gpu -rs 2>&1 | tee "$OUT/tests_gpu.log" | tail -15
    bench . default
    ;;
old)
    build .old
    bench .old old_default
    build .
    bench . direct topology.mem_layout=page_first_direct topology.io_backend=direct
    ;;
esac
