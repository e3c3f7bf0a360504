"""scripts/benchmark.py runs end to end and writes every figure it promises (no timing assertions)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_env

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it


@pytest.mark.parametrize("processes", [1, 2])
def test_benchmark_writes_its_json(synth, tmp_path, processes):
    json_path = tmp_path / "bench.json"
    launcher = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                        f"--nproc_per_node={processes}"]
    result = subprocess.run(
        [*launcher, "scripts/benchmark.py", "--config", "crnn.yaml", "--steps", "2", "--warmup", "1",
         "--json", str(json_path), f"data.train=[{synth / 'train'}]", f"data.val=[{synth / 'val'}]",
         "train.batch_size=4", "train.eval_batch_size=16", "data.num_workers=1", "model.hidden_size=32",
         "model.channels=[64,128,256,256,512,512,512]", "data.augment=light",  # the paper's widths, augmented
         # The options win over the overrides before them.
         "--batch-size", "8", "--precision", "fp32", "--threads", "1", "--no-channels-last"],
        cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(json_path.read_text())
    assert "loop / floor" in result.stdout
    for key in ("train_images_per_s", "compute_floor_images_per_s", "data_loading_images_per_s"):
        assert results[key]["total"] > 0 and results[key]["per_process_rank0"] > 0
        # The total adds up every process's rate; one process's is a part of it.
        assert results[key]["total"] > results[key]["per_process_rank0"] if processes > 1 else \
            results[key]["total"] == results[key]["per_process_rank0"]
    assert results["eval_images_per_s"] > 0 and results["matmul_gflops_per_s_per_process"] > 0
    # The paper CRNN at 32x100 does about 0.7 GMAC per image forward: counted, not guessed.
    assert 1.0 < results["forward_gflops_per_image"] < 2.0
    assert results["train_step_gflops_per_image"] > 2 * results["forward_gflops_per_image"]
    assert results["processes"] == processes and results["global_batch"] == 8
    assert results["threads_per_process"] == 1 and results["channels_last"] is False
    assert results["precision"] == "fp32" and results["compile"] is False
