"""Write an LMDB in the field's text-recognition format.

Keys: `image-%09d` (encoded image bytes) and `label-%09d` (UTF-8 text), 1-based and contiguous, plus
`num-samples`. This is the layout bgshih/crnn, crnn.pytorch, deep-text-recognition-benchmark,
parseq and mmocr read.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import lmdb

COMMIT_EVERY = 1000
MAP_SIZE = 1 << 40  # address space only: the file grows with what is written


def write_lmdb(path: str | Path, samples: Iterable[tuple[bytes, str]], overwrite: bool = False) -> int:
    """Write `(image_bytes, label)` pairs to a new LMDB folder at `path`; return how many.

    The LMDB is built in a temporary folder beside `path` and renamed into place at the end, so a
    crash never leaves a half-written dataset where a good one was. An existing `path` is an error
    unless `overwrite` is set.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; remove it or pass --overwrite to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        env = lmdb.open(str(staging), map_size=MAP_SIZE, subdir=True)
        count = 0
        txn = env.begin(write=True)
        for image_bytes, label in samples:
            count += 1
            txn.put(b"image-%09d" % count, image_bytes)
            txn.put(b"label-%09d" % count, label.encode("utf-8"))
            if count % COMMIT_EVERY == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.put(b"num-samples", str(count).encode())
        txn.commit()
        env.sync()
        env.close()
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return count
