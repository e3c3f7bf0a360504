"""Write an LMDB in the field's text-recognition format.

The keys are data/lmdb_keys.py's, the layout bgshih/crnn, crnn.pytorch,
deep-text-recognition-benchmark, parseq and mmocr read.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from data.lmdb_keys import NUM_SAMPLES, image_key, label_key, meta_key

COMMIT_EVERY = 1000
# The map starts small and doubles whenever it fills: a fixed huge map is only address space on
# Linux, but some platforms (Windows) allocate the file to the map's size up front.
INITIAL_MAP_SIZE = 64 << 20


def write_lmdb(path: str | Path, samples: Iterable[tuple[bytes, str] | tuple[bytes, str, bytes]],
               overwrite: bool = False) -> int:
    """Write `(image_bytes, label)` pairs to a new LMDB folder at `path`; return how many. A third
    item, if given, is stored as `meta-%09d` (what made the sample; readers of the format ignore it).

    The LMDB is built in a temporary folder beside `path` and renamed into place at the end, so a
    crash never leaves a half-written dataset where a good one was. An existing `path` is an error
    unless `overwrite` is set.
    """
    path = Path(path)
    check_replaceable(path, overwrite)
    with staged_lmdb(path) as staging:
        env = lmdb.open(str(staging), map_size=INITIAL_MAP_SIZE, subdir=True)
        count = 0
        pending: list[list[tuple[bytes, bytes]]] = []  # each sample's (key, value) pairs since the last commit
        for image_bytes, label, *meta in samples:
            count += 1
            pending.append([(image_key(count), image_bytes), (label_key(count), label.encode("utf-8")),
                            *((meta_key(count), value) for value in meta)])
            if len(pending) == COMMIT_EVERY:
                commit(env, pending)
                pending = []
        commit(env, pending, num_samples=count)
        env.sync()
        env.close()
    return count


@contextmanager
def staged_lmdb(path: Path) -> Iterator[Path]:
    """A new folder beside `path` to build an LMDB in (close it before the block ends): renamed to
    `path`, replacing what was there, when the block succeeds; removed when it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def check_replaceable(path: Path, overwrite: bool) -> None:
    """Refuse to write over anything but (with `overwrite`) an LMDB folder or an empty one: never a file
    or a folder of other things (`--out datasets` by mistake)."""
    if not path.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists; remove it or pass --overwrite to replace it")
    if not (path.is_dir() and ((path / "data.mdb").is_file() or not any(path.iterdir()))):
        raise FileExistsError(f"{path} exists and is not an LMDB folder (no data.mdb); --overwrite replaces only an"
                              f" LMDB: give another path")


def commit(env: lmdb.Environment, pending: list[list[tuple[bytes, bytes]]], num_samples: int | None = None) -> None:
    """Write `pending` (each sample's keys and values) in one transaction, doubling the map until it fits."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for pairs in pending:
                    for key, value in pairs:
                        txn.put(key, value)
                if num_samples is not None:
                    txn.put(NUM_SAMPLES, str(num_samples).encode())
            return
        except lmdb.MapFullError:  # the transaction was aborted: grow and write it again
            env.set_mapsize(2 * env.info()["map_size"])
