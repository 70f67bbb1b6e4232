set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null || true
AEC_REQUIRE_TUNED=1 OUT=$OUT bash bench/library_gpu.sh; echo "library_gpu exit $?"
