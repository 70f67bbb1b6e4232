#!/usr/bin/env bash
# The three loaders of a kernel library on a GPU machine, in one run (no
# Rust toolchain needed there). From the repository root, with the
# libraries and the test binary built here and carried:
#
#   C=target/toolchains/cuda/nvidia; export LD_LIBRARY_PATH=$C/cu13/lib AEC_CUDA_INCLUDE=$C/cu13/include
#   cargo build --release -p aec-bench --bin tuning_fixture
#   target/release/tuning_fixture target/libs/tuning-fixture.json   # tuning-table kernels to check
#   T="--tuning-cache target/libs/tuning-fixture.json"
#   aec compile examples/softmax.rs examples/sigmoid.rs examples/retnet_parallel.rs \
#       examples/mamba2.rs examples/decode.rs --target h100 --head-dims 128 $T -o target/libs/py
#   aec compile examples/softmax.rs --target h100 --head-dims 128 $T -o target/libs/c_softmax
#   aec compile examples/alibi.rs examples/decode.rs examples/mamba2.rs examples/softmax.rs \
#       --target h100,a100 --head-dims 128x64 $T -o target/libs/more
#   aec compile examples/mla_decode.rs --target h100 --v-in-k -o target/libs/latent
#   cargo test --release --test gpu_library --no-run   # copied to target/gpu-bin/gpu_library
#
#   OUT=$OUT bash bench/library_gpu.sh
#
# With the fixture every loader's check runs a tuning-table kernel in its
# bucket and the default outside (AEC_REQUIRE_TUNED=1 makes a library
# without one for this GPU a failure).
#
# Runs the PyTorch module's check and benchmark (bench/library_check.py),
# the C header's check (bench/library_c_check.sh) and the Rust loader's GPU
# tests (tests/gpu_library.rs); each writes its results under $OUT. Exits
# nonzero when any of them failed.
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
status=0
echo "== PyTorch module"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/library_check.py target/libs/py > "$OUT/library_python.log" 2>&1 || status=1
tail -40 "$OUT/library_python.log"
echo "== C header"
timeout 200 bash bench/library_c_check.sh target/libs/c_softmax target/libs/more || status=1
tail -5 "$OUT/library_c_check.log"
echo "== Rust loader"
AEC_REQUIRE_GPU=1 AEC_TEST_LIBRARY=target/libs/more AEC_TEST_LATENT_LIBRARY=target/libs/latent \
    timeout 200 target/gpu-bin/gpu_library \
    --test-threads=1 > "$OUT/library_rust.log" 2>&1 || status=1
tail -12 "$OUT/library_rust.log"
exit $status
