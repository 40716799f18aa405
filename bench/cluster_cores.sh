#!/usr/bin/env bash
# The check of the dilation itself (issue #31 item 6): bench/cluster_e2e.py
# undilated (D = 1) on a host with a real core per emulated machine, to put
# beside the dilated figures of a small host (README, "on the runtime").
#
#   bash bench/cluster_cores.sh OUT_DIR [SECONDS_PER_CLUSTER_SIZE]
#
# Needs the project's dependencies importable by `python3` (an install, or
# PYTHONPATH) and at least 16 cores for the 16-machine run. Each cluster size
# runs in its own invocation with its own --out, under `timeout`, so a run cut
# short still leaves the ones before it. Modes: isolated, isolated-1 and
# harmony, one all-at-once round, as the README's dilated runs. Then, here:
# `python bench/cluster_hosts.py DILATED.json OUT_DIR/n8.json` compares the
# two job by job, normalized by the cores' speed.
#
# On a machine without the registries (the device machine of this project's
# workplace: Python 3.12 with numpy, numba, scipy, msgpack, psutil already
# there), carry cp312 manylinux wheels of pyzmq, lmdb, isal, cffi, pycparser
# and cryptography >= 47, install them with `pip install --no-index --no-deps
# --target DIR`, and put DIR and the checkout on PYTHONPATH.
set -u
out=${1:?usage: cluster_cores.sh OUT_DIR [SECONDS]}
limit=${2:-250}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1
echo "host: $(nproc) cores, $(python3 -c 'import psutil; print(round(psutil.virtual_memory().total / 2**30))') GiB, python $(python3 -V 2>&1)"
python3 -c "import zmq, lmdb, isal, harmony.comm.sealed, harmony.cluster" || exit 1  # before any run
python3 -m harmony.kernels.warm || exit 1          # numba's cache, as `make venv` does
data=${HARMONY_E2E_DATA:-/tmp/harmony-cluster-e2e}
modes=isolated,isolated-1,harmony
for n in ${HARMONY_CORES_SIZES:-8 16}; do
    if [ "$(nproc)" -lt "$n" ]; then
        echo "skipping $n machines: $(nproc) cores"
        continue
    fi
    timeout "$limit" python3 bench/cluster_e2e.py --quick --dilation 1 --machines "$n" \
        --jobs "$n" --modes "$modes" --data "$data" --out "$out/n$n.json" 2>&1 \
        | tee "$out/n$n.txt"
done
