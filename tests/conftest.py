"""Shared fixtures: small real LMDBs made by the project's own generator."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

REPO = Path(__file__).resolve().parents[1]
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def run_env() -> dict[str, str]:
    """Environment for child processes: one thread each, so two of them share this 2-core machine."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}


def read_lmdb(path: Path) -> list[tuple[bytes, str]]:
    """Every (image bytes, label) of an LMDB, in index order."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        count = int(txn.get(b"num-samples"))
        samples = [(txn.get(b"image-%09d" % i), txn.get(b"label-%09d" % i).decode()) for i in range(1, count + 1)]
    env.close()
    return samples


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Path:
    """A synthetic dataset: OUT/train (96 samples) and OUT/val (33: odd, so shards differ in size)."""
    out = tmp_path_factory.mktemp("data") / "synth"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_synthetic.py"), "--out", str(out),
                    "--train", "96", "--val", "33", "--workers", "1"], check=True, capture_output=True, env=run_env())
    return out
