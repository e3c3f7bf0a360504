"""scripts/slurm_train.sh builds the multi-node torchrun command from SLURM's environment.

`srun` and `scontrol` are stand-ins that print what they were given, as SLURM would run them.
"""

from __future__ import annotations

import subprocess

from tests.conftest import REPO, run_env


def test_slurm_script_starts_one_torchrun_per_node_with_a_shared_rendezvous(tmp_path):
    (tmp_path / "scontrol").write_text(
        '#!/bin/bash\n[ "$*" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n'
    )
    (tmp_path / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    for tool in ("scontrol", "srun"):
        (tmp_path / tool).chmod(0o755)
    env = {
        **run_env(),
        "PATH": f"{tmp_path}:{run_env()['PATH']}",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_ID": "4242",
    }
    result = subprocess.run(
        ["bash", "scripts/slurm_train.sh", "crnn.yaml", "optim.lr=3e-4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    arguments = result.stdout.splitlines()
    assert arguments[:4] == ["--kill-on-bad-exit=1", "python3", "-m", "torch.distributed.run"]
    assert {
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=gpu07:29500",
        "--rdzv_id=4242",
        "--max-restarts=3",
    } <= set(arguments)
    assert arguments[-4:] == ["train.py", "--config", "crnn.yaml", "optim.lr=3e-4"]


def test_slurm_script_without_a_config_says_how_to_call_it():
    result = subprocess.run(["bash", "scripts/slurm_train.sh"], cwd=REPO, env=run_env(), capture_output=True, text=True)
    assert result.returncode != 0 and "usage: sbatch scripts/slurm_train.sh CONFIG" in result.stderr


def test_slurm_script_help_says_what_it_does_outside_a_slurm_job():
    env = {key: value for key, value in run_env().items() if not key.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", "scripts/slurm_train.sh", "--help"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "sbatch --nodes=4 scripts/slurm_train.sh crnn.yaml" in result.stdout and "#SBATCH" not in result.stdout


def test_slurm_script_run_outside_a_slurm_job_says_to_submit_it():
    env = {key: value for key, value in run_env().items() if not key.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", "scripts/slurm_train.sh", "crnn.yaml"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert (
        "error: $SLURM_JOB_NODELIST is not set: this script runs inside a SLURM job; submit it with sbatch"
        in result.stderr
    )
