#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: the CUDA test lane, tools/benchmark.py in the GPU
# configurations, and a short real training run, in one report (Markdown + JSON) with the device and
# the versions. On a machine without CUDA it says so and exits 0, having run nothing.
#
#   tools/gpu_check.sh                                  # -> runs/gpu_check/report.md and report.json
#   OUT=/tmp/check DATA=/nvme/synth STEPS=500 tools/gpu_check.sh
#
# The lane runs one test at a time (a hang costs one test). What it measures, at a GPU-sized global
# batch (BATCH, default 512), in bf16 and fp32:
# - the default network (configs/crnn.yaml) and the paper's (its widths, two BiLSTMs of 256): the
#   training loop, its compute floor and loop/floor (benchmark.py, one process, WORKERS loader workers);
# - data loading alone at 2 to 16 workers (benchmark.py --loading-only);
# - two processes sharing the GPU over gloo (device_ids=[0,0]) against one, default network, bf16;
# - a STEPS-step training run at BATCH, then scripts/eval.sh at batch 1 and at BATCH (images/s).
# It installs nothing: run it in the environment of the README's second command (requirements-dev.txt),
# or name the interpreter that holds torch and the requirements with PYTHON (default python3).
# The data is DATA/train, DATA/val and DATA/test (default datasets/synth, rendered if missing: no
# downloads); put it on the machine's local disk. Each step is bounded by STEP_TIMEOUT seconds; a
# step that fails is marked in the report and the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
DATA=${DATA:-datasets/synth}
STEPS=${STEPS:-300}
BATCH=${BATCH:-512}
WORKERS=${WORKERS:-8}
STEP_TIMEOUT=${STEP_TIMEOUT:-1800}
export PYTHON=${PYTHON:-python3}  # scripts/eval.sh reads it too

# An interpreter without torch is an error, not a machine without CUDA: that would "pass" having run nothing.
if ! "$PYTHON" -c "import torch" 2> /dev/null; then
    echo "gpu_check: $PYTHON cannot import torch: activate the environment of the README's second command, or set" \
         "PYTHON to the interpreter that holds torch (e.g. PYTHON=/opt/venv/bin/python3)" >&2
    exit 1
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: CUDA is not available on this machine (torch.cuda.is_available() is False): nothing was run"
    exit 0
fi
mkdir -p "$OUT"
if [ ! -f "$DATA/train/data.mdb" ]; then
    "$PYTHON" scripts/make_synthetic.py --out "$DATA" --workers "$(nproc)" || exit 1
fi
data=("data.train=[$DATA/train]" "data.val=[$DATA/val]")
paper=("model.channels=[64,128,256,256,512,512,512]" model.hidden_size=256 model.lstm_layers=2 model.cnn_shortcut=false)
timing=(--steps 40 --warmup 10)  # benchmark.py's timed and untimed steps: seconds each at a GPU's pace
failed=()
step() {  # step NAME COMMAND...: run it bounded, its output in OUT/NAME.txt; note a failure and go on
    local name=$1
    shift
    echo "== $name"
    local start=$SECONDS
    timeout -k 20 "$STEP_TIMEOUT" "$@" > "$OUT/$name.txt" 2>&1 || failed+=("$name")  # -k: KILL what ignores TERM
    tail -n 25 "$OUT/$name.txt"
    echo "($name: $((SECONDS - start)) s)"
}
benchmark() {  # benchmark NAME PRECISION [OVERRIDE...]: benchmark.py at the GPU batch, its JSON beside its output
    local name=$1 precision=$2
    shift 2
    step "$name" "$PYTHON" tools/benchmark.py --config crnn.yaml --batch-size "$BATCH" --precision "$precision" \
        "${timing[@]}" --json "$OUT/$name.json" "${data[@]}" "data.num_workers=$WORKERS" "$@"
}

# The lane one test at a time: a test that hangs is stopped at STEP_TIMEOUT, and the next one still runs.
mapfile -t lane < <("$PYTHON" -m pytest -q -m cuda --collect-only -p no:cacheprovider | grep '::')
printf '%s\n' "${lane[@]}" > "$OUT/cuda_lane.ids"
for index in "${!lane[@]}"; do
    step "cuda_lane_$index" "$PYTHON" -m pytest -q -rs -p no:cacheprovider "${lane[$index]}"
done

for precision in bf16 fp32; do
    benchmark "benchmark_default_$precision" "$precision"
    benchmark "benchmark_paper_$precision" "$precision" "${paper[@]}"
done
for workers in 2 4 8 16; do
    step "loading_workers_$workers" "$PYTHON" tools/benchmark.py --config crnn.yaml --loading-only --batch-size "$BATCH" \
        "${timing[@]}" --json "$OUT/loading_workers_$workers.json" "${data[@]}" "data.num_workers=$workers"
done
step benchmark_default_bf16_2proc "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=2 tools/benchmark.py \
    --config crnn.yaml --batch-size "$BATCH" --precision bf16 "${timing[@]}" \
    --json "$OUT/benchmark_default_bf16_2proc.json" "${data[@]}" "data.num_workers=$((WORKERS / 2))" "device_ids=[0,0]"

step train "$PYTHON" train.py --config crnn.yaml "${data[@]}" "train.batch_size=$BATCH" "train.max_steps=$STEPS" \
    train.max_minutes=null "train.eval_every=$STEPS" "train.out_dir=$OUT/train" train.overwrite=true \
    train.tensorboard=false "data.num_workers=$WORKERS"
for eval_batch in 1 "$BATCH"; do
    step "eval_batch_$eval_batch" bash scripts/eval.sh "$OUT/train/best.pt" "$DATA/val" "$DATA/test" \
        --batch-size "$eval_batch" --json "$OUT/eval_batch_$eval_batch.json"
done

"$PYTHON" - "$OUT" "${failed[@]}" <<'PY'
import json, os, platform, shutil, subprocess, sys
from pathlib import Path

import torch

out, failed = Path(sys.argv[1]), sys.argv[2:]
text = {path.stem: path.read_text(errors="replace").strip() for path in sorted(out.glob("*.txt"))}
report = {
    "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
    "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
    "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "?",
    "python": platform.python_version(), "cpus": len(os.sched_getaffinity(0)),
    "lane": {test: (text.get(f"cuda_lane_{index}") or "(no output)").splitlines()[-1]
             for index, test in enumerate((out / "cuda_lane.ids").read_text().split())},
    "benchmarks": {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))},
    "eval_images_per_s": {name: next((line for line in text[name].splitlines() if "images/s" in line), None)
                          for name in text if name.startswith("eval_batch_")},
    "failed": failed,
}
(out / "report.json").write_text(json.dumps(report, indent=1))
lines = [f"# GPU check: {report['device']} x {report['gpus']}", "",
         f"torch {report['torch']}, CUDA {report['cuda']}, cuDNN {report['cudnn']}, driver {report['driver']}, "
         f"Python {report['python']}, {report['cpus']} CPU cores", "",
         "## CUDA lane", "", *(f"- {test}: {result}" for test, result in report["lane"].items()), ""]
for name, output in text.items():
    if not name.startswith("cuda_lane_"):
        lines += [f"## {name}", "", "```", "\n".join(output.splitlines()[-25:]), "```", ""]
lines.append(f"FAILED: {', '.join(failed)} (see their .txt)" if failed else "every step passed")
(out / "report.md").write_text("\n".join(lines) + "\n")
print(f"report: {out / 'report.md'} and {out / 'report.json'}; " + (f"FAILED: {failed}" if failed else "all passed"))
sys.exit(1 if failed else 0)
PY
