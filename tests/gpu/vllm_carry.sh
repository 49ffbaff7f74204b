#!/usr/bin/env bash
# vLLM 0.26 (the release of the device's torch 2.11) on the device machine (no internet, 64 MiB
# a call), in two calls of the device tool within its warm window (docs/development.md):
#   1. carry [".vso"]:  bash tests/gpu/vllm_carry.sh keep   (its compiled _C: 53 MiB as xz)
#   2. carry [".whl"]:  bash tests/gpu/vllm_carry.sh run    (its Python tree, FlashAttention-3
#      and FlashMLA, the packages the image lacks): the connector's cuda tests, then a real
#      vllm.LLM writing and reading the file store (tests/gpu/vllm_llm_ttft.py); logs in $OUT.
set -euo pipefail
KEEP=/tmp/vllm-keep
case "$1" in
keep)
    mkdir -p "$KEEP"
    xz -T0 -dc .vso/_C_stable_libtorch.abi3.so.xz >"$KEEP/_C_stable_libtorch.abi3.so"
    ls -la "$KEEP"
    ;;
run)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    tar -xJf .whl/vllm_py.tar.xz -C /tmp/site
    tar -xJf .whl/vllm_ext.tar.xz -C /tmp/site
    cp "$KEEP/_C_stable_libtorch.abi3.so" /tmp/site/vllm/
    export PYTHONPATH=/tmp/site:$PWD
    ln -sfn ../conf pipeline/conf
    inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    for ext in pipeline/engine/l3/stores/_fileio pipeline/engine/cuda/_blocks; do
        gcc -O2 -pthread -shared -fPIC -I"$inc" $ext.c -o $ext.cpython-312-x86_64-linux-gnu.so
    done
    nvidia-smi --query-gpu=name,driver_version --format=csv >"$OUT/gpu.txt"
    python3 -c 'import torch, vllm; print(torch.__version__, vllm.__version__)' >"$OUT/versions.txt" 2>&1
    python3 -m pytest -o addopts="" -p no:cacheprovider -v -k cuda \
        tests/unit/test_vllm_connector.py 2>&1 | tee "$OUT/vllm_connector_cuda.log" | tail -5 || true
    # vLLM 0.26 seeds block hashes at random per process unless PYTHONHASHSEED is set
    export PYTHONHASHSEED=0
    export VLLM_USE_FLASHINFER_SAMPLER=0  # FlashInfer does not travel: the sampler vLLM falls back to
    rm -rf /tmp/llm && mkdir -p /tmp/llm
    for phase in write read; do
        timeout 280 python3 tests/gpu/vllm_llm_ttft.py /tmp/llm "$phase" \
            >"$OUT/vllm_llm_$phase.log" 2>&1 || echo "$phase: exit $?"
        grep -h "^RESULT\|Error\|error:" "$OUT/vllm_llm_$phase.log" | tail -5 || true
    done
    ;;
esac
