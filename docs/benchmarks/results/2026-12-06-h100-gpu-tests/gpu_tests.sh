set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ln -sfn ../conf pipeline/conf  # what the install maps (pyproject: pipeline.conf = conf/)
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
gcc -O2 -pthread -shared -fPIC -I$inc pipeline/engine/l3/stores/_fileio.c -o pipeline/engine/l3/stores/_fileio.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
git log --oneline -1 2>/dev/null
timeout 500 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/gpu -rs --junitxml=$OUT/gpu_junit.xml 2>&1 | tee $OUT/tests_gpu.log | tail -40
