#!/bin/sh
# make demo: 2 data-parallel PyTorch workers share a pool of 2 emulated GPUs,
# train on scikit-learn's digits and print test accuracy and images/second.
set -e
cd "$(dirname "$0")/.."
GPUPOOL_STATE="${GPUPOOL_STATE:-$PWD/.demo/state}"
GPUPOOL_DEVICES="${GPUPOOL_DEVICES:-emulated:2x16GiB}"
export GPUPOOL_STATE GPUPOOL_DEVICES
GPUPOOL="${GPUPOOL:-.venv/bin/gpupool}"
$GPUPOOL submit examples/digits-ddp.yaml --follow
$GPUPOOL jobs digits-ddp
