"""Opening an LMDB in the field's format read-only (once per process), and what says which samples
it holds: num-samples, and the first and highest sample index of its keys (which decide: a header
that says less or more is reported, not obeyed). Keys: data/lmdb_keys.py."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from data.lmdb_keys import IMAGE_PREFIX, LABEL_PREFIX, NUM_SAMPLES, image_key, label_key


def open_lmdb(root: str | Path, readahead: bool = False) -> lmdb.Environment:
    """Open an LMDB folder read-only, with a clear error when it is not one. `readahead` suits reading
    in key order (a scan); off, it suits random reads of samples, where it would only waste the page cache."""
    root = Path(root)
    if root.is_file():
        hint = f"; give its folder, {root.parent}" if root.name == "data.mdb" else ""
        raise FileNotFoundError(f"LMDB {root} is a file: an LMDB is a folder holding data.mdb{hint}")
    if not root.is_dir():
        raise FileNotFoundError(f"LMDB folder {root} does not exist")
    if not (root / "data.mdb").is_file():
        raise FileNotFoundError(f"{root} holds no data.mdb: it is not an LMDB folder (see scripts/create_lmdb.py)")
    if not os.access(root / "data.mdb", os.R_OK):
        raise PermissionError(f"{root / 'data.mdb'}: no permission to read it; fix its permissions (chmod a+r)")
    try:
        # lock=False: readers of a read-only dataset need no lock file, and the folder may be read-only.
        env = lmdb.open(str(root), readonly=True, lock=False, readahead=readahead, meminit=False, max_readers=512)
    except lmdb.Error as error:  # a data.mdb that is not an LMDB (cut short, or another file renamed)
        raise ValueError(
            f"{root / 'data.mdb'} is not a readable LMDB ({error}); rebuild it with " f"scripts/create_lmdb.py"
        ) from None
    check_whole(env, root)
    return env


def check_whole(env: lmdb.Environment, root: Path) -> None:
    """Raise, naming the folder, when data.mdb is shorter than the pages its header counts. LMDB reads its
    pages through a memory map: one past the end of a file cut short (a failed copy, a full disk) kills
    the process with a bus error at the first read of it, with no word of which dataset. Checked once per
    opening, from the header (the last page's number), before any page is read."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = (root / "data.mdb").stat().st_size
    if size < needed:
        env.close()
        raise ValueError(
            f"LMDB {root}: data.mdb is {size:,} bytes but its records need {needed:,}; it was cut short (a"
            f" failed copy?): copy it again, or rebuild it with scripts/create_lmdb.py"
        )


# py-lmdb allows one open environment per file per process, and the same LMDB may back several
# datasets (train and val, or listed twice). Keyed by process id: an environment must not cross a fork.
_ENVIRONMENTS: dict[tuple[int, str], lmdb.Environment] = {}


# Every sample read asks for its LMDB's environment: its path resolved once, not with three lstat calls each time.
real_path = functools.lru_cache(maxsize=256)(os.path.realpath)


def shared_lmdb(root: str | Path) -> lmdb.Environment:
    """This process's read-only environment for `root`, opened on first use and kept open."""
    key = (os.getpid(), real_path(str(root)))
    if key not in _ENVIRONMENTS:
        _ENVIRONMENTS[key] = open_lmdb(root)
    return _ENVIRONMENTS[key]


@contextmanager
def lmdb_for_scan(root: str | Path) -> Iterator[lmdb.Environment]:
    """The shared environment if this process has one, else one closed afterwards: py-lmdb's
    one-environment-per-file rule survives a fork, so a parent that kept one open would stop its
    data-loader workers from opening theirs. A new one reads ahead: a scan walks the keys in order,
    and on pages not yet in memory the kernel's readahead turns its page faults into long reads."""
    key = (os.getpid(), os.path.realpath(root))
    if key in _ENVIRONMENTS:
        yield _ENVIRONMENTS[key]
        return
    env = open_lmdb(root, readahead=True)
    try:
        yield env
    finally:
        env.close()


def read_num_samples(txn: lmdb.Transaction, root: str | Path) -> int:
    raw = txn.get(NUM_SAMPLES)
    if raw is None:
        raise ValueError(f"{root}: the LMDB has no 'num-samples' key; it is not in the text-recognition format")
    raw = bytes(raw)  # a memoryview in a buffers=True transaction
    try:
        total = int(raw)
    except ValueError:
        raise ValueError(f"{root}: 'num-samples' is {raw!r}, not an integer") from None
    if total < 0:
        raise ValueError(f"{root}: 'num-samples' is {total}; it must count the samples (0 or more)")
    return total


def highest_index(txn: lmdb.Transaction) -> int:
    """The highest index of an `image-` or `label-` key (0 if none), from two cursor seeks: no sample
    lies beyond it, whatever num-samples says."""
    highest = 0
    for prefix in (IMAGE_PREFIX, LABEL_PREFIX):
        cursor = txn.cursor()
        # The key just before the first one past the prefix's keys, or the very last key.
        found = cursor.prev() if cursor.set_range(prefix + b"\xff") else cursor.last()
        key = bytes(cursor.key()) if found else b""
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            highest = max(highest, int(key[len(prefix) :]))
    return highest


def first_index(txn: lmdb.Transaction) -> int:
    """1, as the format counts; 0 where a converter counting from 0 wrote a sample there."""
    return 0 if txn.get(image_key(0)) is not None or txn.get(label_key(0)) is not None else 1
