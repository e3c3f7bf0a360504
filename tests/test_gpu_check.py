"""tools/gpu_check.sh on a machine without CUDA: says so, runs nothing, exits 0 (its GPU half: tests/test_cuda.py)."""

from __future__ import annotations

import subprocess
import sys

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


def test_an_interpreter_without_torch_is_an_error_not_a_machine_without_cuda(tmp_path):
    """On a GPU image whose `python3` is not the one with torch, the check must fail, not "pass" having run
    nothing (seen on the first lent GPU: the CUDA probe's ImportError read as no CUDA)."""
    without_site = tmp_path / "python"
    without_site.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # -S: no site-packages, so no torch
    without_site.chmod(0o755)
    result = subprocess.run(
        ["bash", "tools/gpu_check.sh"],
        cwd=REPO,
        env={**run_env(), "OUT": str(tmp_path / "out"), "PYTHON": str(without_site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"{without_site} cannot import torch" in result.stderr and "set PYTHON" in result.stderr
    assert "nothing was run" not in result.stdout and not (tmp_path / "out").exists()
