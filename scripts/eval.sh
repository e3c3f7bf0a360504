#!/usr/bin/env bash
# Evaluate a checkpoint on one or more LMDB sets and print a table:
#   scripts/eval.sh CHECKPOINT LMDB [LMDB ...] [--json PATH] [--config CFG] [--metric-mode MODE]
#                   [--dump PREDICTIONS.tsv] [--errors MISREADS.png [--errors-count N]] [--readings READINGS.png]
#                   [--slices]
# Every option: scripts/eval.sh --help.
# NPROC=N runs N processes under torchrun (default 1); the numbers are the same for any N.
# PYTHON picks the interpreter (default: python3 on PATH, e.g. the activated .venv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! [[ "${NPROC:-1}" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: NPROC=${NPROC}: give the number of processes, a whole number from 1 (e.g. NPROC=2), or leave it" \
         "unset for one" >&2
    exit 1
fi
# One process runs without torchrun, so an error is its one line, not under torchrun's traceback.
if [ "${NPROC:-1}" = 1 ]; then
    exec "${PYTHON:-python3}" "$here/eval.py" "$@"
fi
exec "${PYTHON:-python3}" -m torch.distributed.run --standalone --nproc_per_node="${NPROC}" "$here/eval.py" "$@"
