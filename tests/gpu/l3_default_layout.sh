#!/usr/bin/env bash
# The default config's L3 loads on the GPU host (issue 65), every bench on defaults (no layout
# or io override): `bash l3_default_layout.sh tests` (tests/gpu), `... l3` (bench=l3, 16K, file
# and Mooncake, 4 and 16 I/O threads), `... ttft` (bench=ttft, 16K then 64K, host tier, file and
# Mooncake; `ttft16`: 16K alone). To compare: `ttft_host_page_first` (host hits at 16K and 64K on the token-major
# pool with kernels, the presets' before mem_layout auto), `fragmented` (the host tier's
# fragmented 16K transfers on the direct backend and on kernels), `pieces` (Mooncake at 16K,
# one object a page against `storage.stream_layers=8`'s pieces: the probe, bench=l3, bench=ttft).
# Several modes in one call:
# `... tests l3`. Logs and bench JSON under $OUT.
# Needs .whl/ (the project's cp312 wheels) and .whl/l3/ (Mooncake's CPU build and the Debian
# packages libibverbs1 libnl-3-200 libnl-route-3-200; docs/development.md).
set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl/l3/*.whl
for deb in .whl/l3/*.deb; do dpkg -x "$deb" /tmp/ib; done
export LD_LIBRARY_PATH=/tmp/ib/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:$PWD
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
ln -sfn ../conf pipeline/conf
for ext in pipeline/engine/l3/stores/_fileio pipeline/engine/cuda/_blocks; do
    gcc -O2 -pthread -shared -fPIC -I"$inc" $ext.c -o $ext.cpython-312-x86_64-linux-gnu.so
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {  # name, seconds, overrides...
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 -m pipeline bench model=deepseek_v3 topology=tp1 \
        topology.device=cuda 'bench.strategies=[replicated]' runtime.timeout_s=180 \
        bench.out_dir="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: rc $? after ${SECONDS}s"
    grep -E '^\|' "$OUT/$name.log" | tail -20
}
for mode in "$@"; do
    case "$mode" in
    tests)
        timeout 240 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/gpu -rs \
            --junitxml="$OUT/tests_gpu.xml" >"$OUT/tests_gpu.log" 2>&1
        tail -12 "$OUT/tests_gpu.log"
        ;;
    l3)
        for t in 4 16; do
            bench "l3_t$t" 150 bench=l3 'bench.sizes=[16384]' storage.io_threads=$t
        done
        ;;
    ttft_host_page_first)  # host-tier hits on the token-major pool with kernels, to compare
        bench ttft_host_page_first_16k 200 bench=ttft 'bench.sizes=[16384]' \
            'bench.stores=[none]' topology.mem_layout=page_first
        bench ttft_host_page_first_64k 200 bench=ttft 'bench.sizes=[65536]' \
            'bench.stores=[none]' topology.mem_layout=page_first bench.repeats=2
        ;;
    fragmented)  # fragmented 16K pages between the tiers: direct backend against kernels
        bench fragmented_16k 200 'bench.sizes=[16384]' 'bench.placements=[fragmented]' \
            'bench.fragmented_io=[direct,kernel]' 'bench.chunk_pages=[0]'
        ;;
    pieces)  # Mooncake: one object a page (defaults) against a piece a layer group
        timeout 150 python3 benchmarks/mooncake_pieces.py --pages 256 \
            --json "$OUT/mooncake_pieces.json" >"$OUT/mooncake_pieces.log" 2>&1
        echo "mooncake_pieces: rc $? after ${SECONDS}s"
        tail -4 "$OUT/mooncake_pieces.log"
        for s in null 8; do
            bench "l3_mc_s$s" 100 bench=l3 'bench.sizes=[16384]' 'bench.stores=[mooncake]' \
                storage.stream_layers=$s
            bench "ttft_mc_16k_s$s" 150 bench=ttft 'bench.sizes=[16384]' \
                'bench.stores=[mooncake]' storage.stream_layers=$s
        done
        ;;
    ttft16)  # the 16K half of ttft
        bench ttft_16k 280 bench=ttft 'bench.sizes=[16384]'
        ;;
    ttft)
        bench ttft_16k 280 bench=ttft 'bench.sizes=[16384]'
        bench ttft_64k 280 bench=ttft 'bench.sizes=[65536]' bench.repeats=2
        ;;
    esac
done
