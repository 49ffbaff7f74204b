#!/usr/bin/env bash
# second call: bench=l3 (file and Mooncake, 4 and 16 threads) and bench=ttft at 16K and 64K, defaults
bash tests/gpu/l3_default_layout.sh l3 ttft 2>&1 | tail -60
