#!/bin/bash
# Train on several machines under SLURM: one torchrun per node, one worker per GPU.
#
#   sbatch --nodes=4 scripts/slurm_train.sh crnn.yaml train.out_dir=runs/big optim.lr=3e-4
#
# The run folder (train.out_dir) must be on a file system every node sees. A job that is requeued,
# preempted or resubmitted continues from the newest checkpoint there (train.resume=auto).
#SBATCH --job-name=crnn
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1     # one torchrun per node; it starts the workers
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120       # SIGTERM 2 minutes before the time limit: every rank checkpoints and exits
#SBATCH --requeue               # after a preemption or a node failure, run again (and resume)
#SBATCH --output=%x-%j.out
set -euo pipefail

usage="usage: sbatch scripts/slurm_train.sh CONFIG [key=value ...]  (--help: what it does)"
if [[ $# -eq 0 ]]; then
    echo "$usage" >&2
    exit 2
fi
if [[ $1 == -h || $1 == --help ]]; then
    # The header above, without the #SBATCH lines: what the script does and how to call it.
    sed -n '2,/^#SBATCH/{/^#SBATCH/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
fi
for variable in SLURM_JOB_NODELIST SLURM_JOB_NUM_NODES SLURM_JOB_ID; do
    if [[ -z ${!variable:-} ]]; then
        echo "error: \$$variable is not set: this script runs inside a SLURM job; submit it with sbatch" >&2
        echo "$usage" >&2
        exit 2
    fi
done
config=$1
shift
# The whole list, then its first line: `| head -n 1` would close the pipe early, and under pipefail
# scontrol's SIGPIPE (exit 141) fails the script whenever it had more lines left to write.
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes%%$'\n'*}
gpus_per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}

# --max-restarts: a worker that dies (a GPU error, an OOM kill) brings every worker back, and they
# continue from the last checkpoint instead of ending the job.
srun --kill-on-bad-exit=1 "${PYTHON:-python3}" -m torch.distributed.run \
    --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node="$gpus_per_node" \
    --rdzv_backend=c10d --rdzv_endpoint="$head_node:${PORT:-29500}" --rdzv_id="$SLURM_JOB_ID" \
    --max-restarts="${MAX_RESTARTS:-3}" \
    train.py --config "$config" "$@"
