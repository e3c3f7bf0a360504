"""tools/gpu_check.sh on a machine without CUDA: says so, runs nothing, exits 0 (its GPU half: tests/test_cuda.py)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from conftest import REPO, run_env


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the check itself")
def test_the_gpu_check_says_there_is_no_cuda_and_writes_nothing(tmp_path):
    result = subprocess.run(
        ["bash", "tools/gpu_check.sh"],
        cwd=REPO,
        env={**run_env(), "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA is not available on this machine" in result.stdout and "nothing was run" in result.stdout
    assert not (tmp_path / "out").exists()
