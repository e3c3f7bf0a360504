#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: the CUDA test lane, tools/benchmark.py in the GPU
# configurations, and a short real training run, in one report (Markdown + JSON) with the device and
# the versions. On a machine without CUDA it says so and exits 0, having run nothing.
#
#   tools/gpu_check.sh                  # -> runs/gpu_check/report.md and report.json
#   OUT=/tmp/check STEPS=500 tools/gpu_check.sh
#
# It installs nothing: run it in the environment of the README's second command (requirements-dev.txt),
# which holds what the lane and the benchmark need. The data is the built-in synthetic set
# (datasets/synth, rendered here if missing: no downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
STEPS=${STEPS:-300}  # steps of the short training run

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: CUDA is not available on this machine (torch.cuda.is_available() is False): nothing was run"
    exit 0
fi
mkdir -p "$OUT"
if [ ! -f datasets/synth/train/data.mdb ]; then
    python scripts/make_synthetic.py --out datasets/synth --workers "$(nproc)"
fi

status=0
echo "== the CUDA test lane"
python -m pytest -q -m cuda -rs -p no:cacheprovider --junitxml "$OUT/cuda_lane.xml" | tee "$OUT/cuda_lane.txt" || status=1

echo "== benchmark.py: the training loop, its compute floor, data loading"
for precision in bf16 fp32; do
    for batch in 256 1024; do
        python tools/benchmark.py --config crnn.yaml "model.channels=[64,128,256,256,512,512,512]" --precision "$precision" \
            --batch-size "$batch" data.num_workers=8 --json "$OUT/benchmark_${precision}_${batch}.json" \
            | tee "$OUT/benchmark_${precision}_${batch}.txt" || status=1
    done
done
for workers in 1 2 4 8 16; do
    python tools/benchmark.py --config crnn.yaml "model.channels=[64,128,256,256,512,512,512]" --precision bf16 --batch-size 512 \
        "data.num_workers=$workers" --json "$OUT/benchmark_workers_${workers}.json" \
        > "$OUT/benchmark_workers_${workers}.txt" || status=1
done

echo "== a short training run ($STEPS steps)"
python train.py --config crnn.yaml "model.channels=[64,128,256,256,512,512,512]" train.batch_size=512 "train.max_steps=$STEPS" \
    train.eval_every="$STEPS" train.out_dir="$OUT/train" train.overwrite=true data.num_workers=8 \
    > "$OUT/train.txt" 2>&1 || status=1
scripts/eval.sh "$OUT/train/best.pt" datasets/synth/val datasets/synth/test --json "$OUT/eval.json" \
    | tee "$OUT/eval.txt" || status=1

python - "$OUT" "$status" <<'PY'
import json, platform, subprocess, sys
from pathlib import Path

import torch

out, status = Path(sys.argv[1]), int(sys.argv[2])
report = {
    "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
    "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
    "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip(),
    "python": platform.python_version(), "cpus": len(__import__("os").sched_getaffinity(0)),
    "lane": (out / "cuda_lane.txt").read_text().strip().splitlines()[-1:],
    "benchmarks": {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("benchmark_*.json"))},
    "evaluation": json.loads((out / "eval.json").read_text()) if (out / "eval.json").is_file() else None,
    "passed": status == 0,
}
(out / "report.json").write_text(json.dumps(report, indent=1))
lines = [f"# GPU check: {report['device']} x {report['gpus']}", "",
         f"torch {report['torch']}, CUDA {report['cuda']}, cuDNN {report['cudnn']}, driver {report['driver']}, "
         f"Python {report['python']}, {report['cpus']} CPU cores", "",
         f"CUDA lane: {' '.join(report['lane'])}", "", "## benchmark.py", ""]
for name in report["benchmarks"]:
    lines += [f"### {name}", "", "```", (out / f"{name}.txt").read_text().strip(), "```", ""]
lines += ["## Short training run", "", "```", (out / "eval.txt").read_text().strip() if (out / "eval.txt").is_file()
          else "(no evaluation)", "```", "", "all steps passed" if status == 0 else "SOME STEPS FAILED: see the files"]
(out / "report.md").write_text("\n".join(lines) + "\n")
print(f"report: {out / 'report.md'} and {out / 'report.json'}")
PY
exit "$status"
