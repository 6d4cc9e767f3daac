#!/usr/bin/env bash
# The GPU figures of issues 12 and 38, on a machine with NVIDIA GPUs, after `make install`:
#   benchmarks/gpu_bench.sh [OUT]        (default OUT: benchmarks/results/gpu-bench)
# ResNet-50 scaling (synthetic and JPEG data, 224 px), sharing one GPU (ResNet-50 and a small
# model), and the trainer against a hand-written loop and against Lightning on CUDA. Each
# `gpupool bench` writes report.json, report.md and report.png under OUT/<name>/.
# BATCH (default 256) and SHARE_BATCH (default 128) set the batch sizes: lower them if a run
# reports out-of-memory. JPEGS=/path uses that class-folder set instead of generated JPEGs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${1:-benchmarks/results/gpu-bench}
BATCH=${BATCH:-256}
SHARE_BATCH=${SHARE_BATCH:-128}
mkdir -p "$OUT"
export GPUPOOL_STATE=${GPUPOOL_STATE:-$OUT/state}
unset GPUPOOL_DEVICES   # the real GPUs, through NVML

N=$(nvidia-smi -L | wc -l)
GPUS=$("$BIN/python" -c "print(','.join(str(2**i) for i in range(8) if 2**i <= $N))")
nvidia-smi -L | tee "$OUT/gpus.txt"

if [ -z "${JPEGS:-}" ]; then
    JPEGS=$OUT/jpegs
    [ -d "$JPEGS" ] || "$BIN/python" -c "
import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks')
from bench_input_pipeline import make_jpegs
make_jpegs(Path('$JPEGS'), 20000, 500, 375, classes=10)"
fi

run() { echo "== gpupool bench $*" >&2; "$BIN/gpupool" bench "$@" --progress || echo "(failed: see the report)" >&2; }
run scaling --model resnet50 --image-size 224 --batch-size "$BATCH" --gpus "$GPUS" --steps 100 --warmup 20 --out "$OUT/r50-scaling-synthetic"
run scaling --model resnet50 --image-size 224 --batch-size "$BATCH" --gpus "$GPUS" --data "$JPEGS" --workers 8 --steps 100 --warmup 20 --out "$OUT/r50-scaling-jpeg"
run share --model resnet50 --image-size 224 --batch-size "$SHARE_BATCH" --fractions 1,0.5,0.25 --steps 100 --warmup 20 --out "$OUT/r50-share"
run share --model convnet --image-size 32 --batch-size 256 --fractions 1,0.5,0.25 --steps 300 --warmup 30 --out "$OUT/small-share"

"$BIN/python" benchmarks/bench_trainer.py --device cuda --model resnet50 --weights none --image-size 224 \
    --batch-size "$BATCH" --workers 8 --data "$JPEGS" --rounds 1 --out "$OUT/trainer_resnet50_cuda.json"
"$BIN/python" benchmarks/bench_lightning.py --device cuda --model resnet50 --image-size 224 \
    --batch-size "$BATCH" --workers 8 --data "$JPEGS" --rounds 2 --out "$OUT/lightning_resnet50_cuda.json"
# Isolation (issue 38): compute splits, a latency-sensitive neighbour, caps; into benchmarks/results/.
"$BIN/python" benchmarks/bench_isolation_gpu.py || echo "(bench_isolation_gpu failed: see its output)" >&2
cat "$OUT"/*/report.md
