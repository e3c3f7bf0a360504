#!/usr/bin/env bash
# The project on a lent GPU, from a checkout that is not installed, with no network: the CUDA test lane, the
# GPU recipe's speed, a short training run and its evaluation, every figure in OUT/report.json. Each step is
# bounded, each part has a time budget, and report.json is rewritten after every step, so a call cut off at
# its limit still brings back what it measured. The lent machine's calls: docs/testing.md, "The CUDA lane".
#
#   tools/gpu_check.sh pack                                       # here, with a network: .gpu_check/
#   OUT=/tmp/out tools/gpu_check.sh lane bench                    # on the GPU: about 7 minutes
#   OUT=/tmp/out tools/gpu_check.sh train                         # on the GPU: about 3 minutes
#   REHEARSE=1 OUT=/tmp/out tools/gpu_check.sh lane bench train   # every step on the CPU, at toy sizes
#
# Parts (none named: all three):
#   lane   `pytest -m cuda` (LANE_SELECT: a -k expression), each test in a pytest process of its own under
#          its own timeout (LANE_TEST_SECONDS, 300), LANE_JOBS (3) side by side
#   bench  tools/benchmark.py in bf16 at the GPU recipe's batch: configs/crnn_gpu.yaml and configs/crnn.yaml
#          (the training loop against its compute floor), crnn_gpu.yaml's data loading alone at 4, 8 and 16
#          workers, and two processes sharing the GPU (device_ids=[0,0], over gloo)
#   train  train.py --config crnn_gpu.yaml for TRAIN_MINUTES (1.5), then scripts/eval.sh on DATA/val and
#          DATA/test at batch 1 and at batch 1024 (images/s)
# OUT (default runs/gpu_check) receives log.txt (every step's output as it comes), report.json and report.md,
# nothing else; checkpoints and temporary files go to SCRATCH (default /tmp/gpu_check).
#
# The machine needs an interpreter with torch (PYTHON, default python3); the project runs from this checkout
# (PYTHONPATH). What that interpreter lacks comes as wheels in WHEELS (default .gpu_check/wheels; those for its
# Python are installed under SCRATCH), the data as LMDBs in DATA (default .gpu_check/synth). `pack` makes both
# with this project's environment: the wheels of lmdb and editdistance that constraints.txt pins, for Python
# WHEEL_PYTHON (3.12) on manylinux x86_64, and PACK_TRAIN (6,000) training images, 1,000 val, 1,000 test.
# Without CUDA the script says so and exits 0 having run nothing, unless REHEARSE=1: every step then runs on
# the CPU (batch 8, a small network, a few steps, 1 or 2 workers, gloo for the two processes, fp32 where the
# CPU has no native bf16) and the report is checked as on a GPU.
#
# Each part has a budget in seconds (LANE_SECONDS=200, BENCH_SECONDS=200, TRAIN_SECONDS=210): a step gets
# what is left of it, at most its own limit, and one that would get under 20 s is skipped and named.
# Exit status: 0 when every step ran and measured (a lane test may be skipped), 1 otherwise: report.md says which.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Paths given relative are relative to where the command was typed, before the cd below.
OUT=$(realpath -m -- "${OUT:-$repo/runs/gpu_check}")
SCRATCH=$(realpath -m -- "${SCRATCH:-/tmp/gpu_check}")
DATA=$(realpath -m -- "${DATA:-$repo/.gpu_check/synth}")
WHEELS=$(realpath -m -- "${WHEELS:-$repo/.gpu_check/wheels}")
export PYTHON=${PYTHON:-python3}  # scripts/eval.sh reads it too
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
REHEARSE=${REHEARSE:-0}
cd "$repo" || exit 1

fail() {
    echo "gpu_check: $*" >&2
    exit 1
}

pin() {  # pin NAME: NAME==VERSION as constraints.txt pins it for the test suite
    grep -m1 -io "^$1==[^ #;]*" "$repo/constraints.txt" ||
        fail "constraints.txt pins no version of $1: add its line (NAME==VERSION), as for the other packages"
}

pack() {  # The wheels the GPU image lacks, and data rendered here: that image has no fonts to draw with.
    local folder=$repo/.gpu_check lmdb editdistance platforms found=0
    lmdb=$(pin lmdb) && editdistance=$(pin editdistance) || exit 1
    mkdir -p "$folder/wheels" && rm -f "$folder/wheels"/*.whl || exit 1
    # The usual tags first; where pip finds none of them, the other manylinux_2_N ones.
    for platforms in "manylinux_2_28 manylinux_2_17 manylinux2014" "manylinux_2_34 manylinux_2_31 manylinux_2_24 manylinux1"; do
        local options=()
        for platform in $platforms; do
            options+=(--platform "${platform}_x86_64")
        done
        if "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
            --implementation cp "${options[@]}" -d "$folder/wheels" "$lmdb" "$editdistance"; then
            found=1
            break
        fi
    done
    ((found)) || fail "pip found no wheels of $lmdb and $editdistance for Python ${WHEEL_PYTHON:-3.12} on" \
        "manylinux x86_64 (above)"
    "$PYTHON" scripts/make_synthetic.py --out "$folder/synth" --train "${PACK_TRAIN:-6000}" --val 1000 --test 1000 \
        --workers "$(nproc)" --overwrite || fail "rendering $folder/synth failed (above)"
    local tree
    tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
    ls -l "$folder/wheels"
    echo "carry .gpu_check: $(du -sb "$folder" | cut -f1) bytes; the checkout's own files: $tree bytes"
}

if [ "${1:-}" = pack ]; then
    pack
    exit 0
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(lane bench train)
for part in "${parts[@]}"; do
    case $part in
        lane | bench | train) ;;
        *) fail "unknown part '$part': name one or more of lane, bench and train (or pack, alone)" ;;
    esac
done
case $REHEARSE in
    0 | 1) ;;
    *) fail "REHEARSE=$REHEARSE: set REHEARSE=1 to rehearse every step on the CPU, or leave it unset" ;;
esac

# An interpreter without torch is an error, not a machine without CUDA: that would "pass" having run nothing.
if ! "$PYTHON" -c "import torch" 2> /dev/null; then
    fail "$PYTHON cannot import torch: set PYTHON to the interpreter that holds torch" \
         "(e.g. PYTHON=/opt/venv/bin/python3), or activate the environment of the README's second command"
fi
if [ "$REHEARSE" = 0 ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: CUDA is not available on this machine (torch.cuda.is_available() is False): nothing was run;" \
         "REHEARSE=1 runs every step on the CPU"
    exit 0
fi
if [[ " ${parts[*]} " =~ " bench "|" train " ]] && [ ! -f "$DATA/train/data.mdb" ]; then
    fail "DATA=$DATA holds no train/ LMDB: run \`tools/gpu_check.sh pack\` where there is a network and carry" \
         ".gpu_check, or set DATA to a folder holding train/, val/ and test/ LMDBs"
fi

mkdir -p "$OUT" "$SCRATCH" || exit 1
log=$OUT/log.txt
report() {  # report COMMAND [ARGUMENT...]: tools/gpu_report.py, which owns report.json
    "$PYTHON" tools/gpu_report.py "$1" "$OUT" "${@:2}"
}

step() {  # step KIND NAME LIMIT [RECORD-OPTION...] -- COMMAND...: bounded by LIMIT and by the part's time left
    local kind=$1 name=$2 limit=$3 options=()
    shift 3
    while [ "$1" != -- ]; do
        options+=("$1")
        shift
    done
    shift
    local left=$((part_end - SECONDS))
    ((left < limit)) && limit=$left
    if ((limit < 20)); then
        report skip "$name" --part "$part" --kind "$kind" --reason "not run: the part's time budget was spent"
        return
    fi
    report begin "$name" --part "$part" --kind "$kind"
    # A lane test writes to a file of its own (they run side by side), appended to the log when it ends.
    local output=${step_output:-$log}
    local from start=$SECONDS
    from=$(stat -c %s "$output" 2> /dev/null || echo 0)
    echo "== $name (at most $limit s): $*" >> "$output"
    # TERM to the step's process group, KILL 30 s later to what ignores it (torchrun first ends its workers).
    timeout -k 30 "$limit" "$@" >> "$output" 2>&1
    local code=$?
    [ "$output" = "$log" ] || options+=(--append-output-to "$log")
    report record "$name" --part "$part" --kind "$kind" --exit-code "$code" --seconds $((SECONDS - start)) \
        --output "$output" --output-from "$from" "${options[@]}"
}

lane_test() {  # lane_test INDEX ID: one test in a pytest process of its own, with its own temporary folder
    local step_output=$SCRATCH/lane/$1.txt
    rm -f "$step_output" "$SCRATCH/lane/$1.xml"
    step lane-test "$2" "${LANE_TEST_SECONDS:-300}" --junit "$SCRATCH/lane/$1.xml" -- "$PYTHON" -m pytest -q -rs \
        -p no:cacheprovider --basetemp "$SCRATCH/lane/$1" --junitxml "$SCRATCH/lane/$1.xml" "$2"
}

lane() {
    mkdir -p "$SCRATCH/lane" || exit 1
    local from tests index=0
    from=$(stat -c %s "$log" 2> /dev/null || echo 0)
    # A test file that cannot be imported here (a package missing) is named, and the lane still runs.
    step lane-collect lane_collect 120 -- "$PYTHON" -m pytest -q -m cuda --collect-only -p no:cacheprovider \
        --continue-on-collection-errors ${LANE_SELECT:+-k "$LANE_SELECT"}
    mapfile -t tests < <(tail -c "+$((from + 1))" "$log" | grep '::' | grep -v '^== ')
    for test in "${tests[@]}"; do
        while (($(jobs -pr | wc -l) >= lane_jobs)); do
            wait -n
        done
        lane_test "$index" "$test" &
        index=$((index + 1))
    done
    wait
}

benchmark() {  # benchmark KIND NAME LIMIT PROCESSES CONFIG [OPTION...] -- [OVERRIDE...]: its JSON into the report
    local kind=$1 name=$2 limit=$3 processes=$4 config=$5 options=() launcher=("$PYTHON")
    shift 5
    while [ "$1" != -- ]; do
        options+=("$1")
        shift
    done
    shift
    ((processes == 1)) || launcher=("$PYTHON" -m torch.distributed.run --standalone "--nproc_per_node=$processes")
    rm -f "$SCRATCH/$name.json"  # a JSON left by an earlier call must not pass for this one's
    # benchmark.py takes its options first: the overrides are one run of positional arguments.
    step "$kind" "$name" "$limit" --figures "$SCRATCH/$name.json" -- "${launcher[@]}" tools/benchmark.py \
        --config "$config" --batch-size "$batch" --precision "$precision" "${timing[@]}" \
        --json "$SCRATCH/$name.json" "${options[@]}" "${overrides[@]}" "$@"
}

bench() {
    benchmark benchmark bench_gpu_recipe 150 1 crnn_gpu.yaml -- "$workers"
    benchmark benchmark bench_cpu_recipe 150 1 crnn.yaml -- "$workers"
    for count in "${loading_workers[@]}"; do
        benchmark loading "loading_workers_$count" 90 1 crnn_gpu.yaml --loading-only -- "data.num_workers=$count"
    done
    benchmark benchmark bench_gpu_recipe_2proc 150 2 crnn_gpu.yaml -- "$workers" "$shared_gpu"
}

train() {
    local run=$SCRATCH/train minutes=${TRAIN_MINUTES:-1.5}
    rm -rf "$run"
    step train train "$(awk "BEGIN { print int($minutes * 60 + 90) }")" --run-dir "$run" -- "$PYTHON" train.py \
        --config crnn_gpu.yaml "${overrides[@]}" "train.out_dir=$run" "train.batch_size=$batch" \
        "train.precision=$precision" train.tensorboard=false "$workers" "${train_length[@]}"
    for eval_batch in "${eval_batches[@]}"; do
        step eval "eval_batch_$eval_batch" 120 -- bash scripts/eval.sh "$run/best.pt" "$DATA/val" "$DATA/test" \
            --batch-size "$eval_batch" --workers "$eval_workers" --precision "$precision"
    done
}

budget() {  # budget PART: its seconds
    case $1 in
        lane) echo "${LANE_SECONDS:-200}" ;;
        bench) echo "${BENCH_SECONDS:-200}" ;;
        train) echo "${TRAIN_SECONDS:-210}" ;;
    esac
}

install_wheels() {  # The packages this interpreter lacks, from the wheels brought along: no network there.
    local tag wheels
    tag=$("$PYTHON" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
    wheels=("$WHEELS"/*-"$tag"-*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "gpu_check: WHEELS=$WHEELS holds no wheel for this Python ($tag):" "$WHEELS"/*.whl | tee -a "$log"
        return
    fi
    local part=setup part_end=$((SECONDS + 120))
    step setup install_wheels 120 -- "$PYTHON" -m pip install -q --no-index --no-deps --upgrade \
        --target "$SCRATCH/site" "${wheels[@]}"
    report check setup || status=1
    # Before the interpreter's own packages: what was brought along is what is meant to run.
    export PYTHONPATH="$repo:$SCRATCH/site${PYTHONPATH#"$repo"}"
}

status=0
# First: the project's modules import what the wheels bring (lmdb).
! compgen -G "$WHEELS/*.whl" > /dev/null || install_wheels

# What differs between a GPU and the CPU rehearsal; everything else is the same command.
read_batch="from training.config import load_config; print(load_config('crnn_gpu.yaml', []).train.batch_size)"
recipe_batch=$("$PYTHON" -c "$read_batch") || fail "cannot read configs/crnn_gpu.yaml's train.batch_size (above)"
if [ "$REHEARSE" = 1 ]; then
    export CUDA_VISIBLE_DEVICES=""  # the CPU's rehearsal also where there is a GPU
    precision=$("$PYTHON" -c "from utils.precision import cpu_has_native_bf16 as b; print('bf16' if b() else 'fp32')")
    batch=8
    # The CPU recipe's widths and a small LSTM: the paper's network took 85 s for one benchmark on 2 cores.
    toy_model=("model.channels=[16,32,48,48,96,96,192]" model.hidden_size=32)
    workers=data.num_workers=1
    timing=(--steps 2 --warmup 1)
    loading_workers=(1 2)
    shared_gpu="device_ids=[]"  # two CPU processes, over gloo
    train_length=(train.max_steps=4 train.max_minutes=null train.eval_every=4 train.log_every=2)
    eval_batches=(1 16)
    eval_workers=1
    lane_jobs=${LANE_JOBS:-2}
else
    precision=bf16
    batch=$recipe_batch
    toy_model=()
    workers=data.num_workers=auto  # the GPU recipe's own; crnn.yaml's 0 is a 2-core CPU's
    timing=(--steps 40 --warmup 10)  # seconds each at a GPU's pace
    loading_workers=(4 8 16)
    shared_gpu="device_ids=[0,0]"  # NCCL refuses two processes on one GPU: gloo joins them
    train_length=("train.max_minutes=${TRAIN_MINUTES:-1.5}")
    eval_batches=(1 1024)
    eval_workers=8
    lane_jobs=${LANE_JOBS:-3}
fi
overrides=("data.train=[$DATA/train]" "data.val=[$DATA/val]" "${toy_model[@]}")  # every run of benchmark.py and train.py

report start --setting "rehearsal=$REHEARSE" --setting "data=$DATA" --setting "precision=$precision" \
    --setting "batch=$batch" --setting "recipe_batch=$recipe_batch" || exit 1
for part in "${parts[@]}"; do
    part_end=$((SECONDS + $(budget "$part")))
    echo "== part $part: at most $(budget "$part") s" >> "$log"
    "$part"
    report check "$part" || status=1
done
echo "report: $OUT/report.json and $OUT/report.md; every step's output: $OUT/log.txt"
exit $status
