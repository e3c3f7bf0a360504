"""Write an LMDB in the field's text-recognition format.

The keys are data/lmdb_keys.py's, the layout bgshih/crnn, crnn.pytorch,
deep-text-recognition-benchmark, parseq and mmocr read.
"""

from __future__ import annotations

import errno
import glob
import os
import resource
import secrets
import shutil
import socket
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import lmdb

from data.lmdb_env import first_index, highest_index, lmdb_for_scan
from data.lmdb_keys import NUM_SAMPLES, LabelNotUtf8, image_key, label_key, meta_key, read_label
from data.provenance import write_meta
from utils.atomic_write import make_folder, remove_empty_folders

SampleRef = tuple[int, int]  # (which source, sample index in it)

# data.mdb and lock.mdb: 0666, as for any file, so the umask decides (py-lmdb's default, 0755 less the
# execute bits it drops, gives 0644 even where the umask lets the group write).
FILE_MODE = 0o666

COMMIT_EVERY = 1000
# The map starts small and doubles whenever it fills: a fixed huge map is only address space on
# Linux, but some platforms (Windows) allocate the file to the map's size up front.
INITIAL_MAP_SIZE = 64 << 20


def labelled_samples(sources: list[Path]) -> list[SampleRef]:
    """Every sample of `sources` that has both an image and a label, in order. A label that is not
    UTF-8 is an error naming it: copied, it would come out changed."""
    samples = []
    for source_number, source in enumerate(sources):
        with lmdb_for_scan(source) as env, env.begin() as txn:
            missing = 0
            for index in range(first_index(txn), highest_index(txn) + 1):
                try:
                    label = read_label(txn, index, strict=True)
                except LabelNotUtf8 as error:
                    raise ValueError(f"{source}: {error}; fix that label (nothing was written)") from None
                if label is None or txn.get(image_key(index)) is None:
                    missing += 1
                else:
                    samples.append((source_number, index))
        if missing:
            print(f"{source}: left out {missing} index(es) without both an image and a label")
    return samples


Sample = tuple[bytes, str] | tuple[bytes, str, bytes]  # image bytes, label[, meta]: what an LMDB holds


def copied_samples(sources: list[Path], samples: list[SampleRef]) -> Iterator[Sample]:
    """The image bytes, label and meta (if any) of `samples`, read from the sources: what write_lmdb copies."""
    with ExitStack() as stack:  # this process's environment where it has one: py-lmdb refuses a second
        transactions = [stack.enter_context(stack.enter_context(lmdb_for_scan(source)).begin()) for source in sources]
        for source_number, index in samples:
            txn = transactions[source_number]
            meta = txn.get(meta_key(index))
            image = txn.get(image_key(index))
            label = read_label(txn, index)
            yield (image, label) if meta is None else (image, label, meta)


def write_lmdb(
    path: str | Path,
    samples: Iterable[tuple[bytes, str] | tuple[bytes, str, bytes]],
    overwrite: bool = False,
    meta: dict[str, Any] | None = None,
) -> int:
    """Write `(image_bytes, label)` pairs to a new LMDB folder at `path`; return how many. A third
    item, if given, is stored as `meta-%09d` (what made the sample; readers of the format ignore it).
    `meta`, if given, is the dataset's record (data/provenance.py), written as its meta.json with the count.

    The LMDB is built in a temporary folder beside `path` and renamed into place at the end, so a
    crash never leaves a half-written dataset where a good one was. An existing `path` is an error
    unless `overwrite` is set.
    """
    path = Path(path)
    check_replaceable(path, overwrite)
    with staged_lmdb(path) as staging:
        count = fill_lmdb(staging, samples)
        if meta is not None:  # staged with the data: a stopped build leaves neither
            write_meta(staging, {**meta, "samples": count})
        return count


def fill_lmdb(folder: Path, samples: Iterable[tuple[bytes, str] | tuple[bytes, str, bytes]]) -> int:
    """Write `samples` as write_lmdb does into `folder`, an empty staging folder (staged_lmdb's); return
    how many. For writers that must put several LMDBs in place together."""
    env = lmdb.open(str(folder), map_size=INITIAL_MAP_SIZE, subdir=True, mode=FILE_MODE)
    count = 0
    pending: list[list[tuple[bytes, bytes]]] = []  # each sample's (key, value) pairs since the last commit
    for image_bytes, label, *meta in samples:
        count += 1
        pending.append(
            [
                (image_key(count), image_bytes),
                (label_key(count), label.encode("utf-8")),
                *((meta_key(count), value) for value in meta),
            ]
        )
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
    `path`, replacing what was there, when the block succeeds; removed when it fails, on any exception
    (KeyboardInterrupt included). A writer killed outright (SIGKILL, a power cut) cannot remove its
    folder: the next writer of `path` on this machine does, once that writer's process is gone."""
    created = make_folder(path.parent)
    remove_stale_staging(path)
    staging = new_staging_folder(path)
    try:
        yield staging
        if path.exists():
            # Moved aside under a staging name, not deleted first: killed between the two renames, the
            # next writer removes it as stale, and `path` is missing for no longer than a rename.
            replaced = staging_name(path)
            path.rename(replaced)
            staging.rename(path)
            shutil.rmtree(replaced)
        else:
            staging.rename(path)
    except BaseException as error:
        # Measured before the staging folder is removed, which frees the space a full disk ran out of.
        failure = describe_write_failure(error, path, staging) if isinstance(error, lmdb.Error) else None
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty_folders(created)  # a tool stopped before its first LMDB leaves no empty --out behind
        if failure:
            raise LmdbWriteError(failure) from None
        raise


class LmdbWriteError(OSError):
    """LMDB could not write: the one line names the LMDB, the free space and what to do."""


def describe_write_failure(error: lmdb.Error, path: Path, staging: Path) -> str:
    """What a failed LMDB write means where it happened. LMDB's own words mislead: a full disk gives a
    short write, which it reports as `mdb_txn_commit: Input/output error`, as if the disk were failing,
    and it names no folder. The free space tells a full disk (or a quota) from a fault; a limit on the
    size of this process's files (ulimit -f) gives the same short write on a disk with room."""
    written = sum(file.stat().st_size for file in staging.glob("*.mdb"))
    free = shutil.disk_usage(staging).free
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    # py-lmdb gives the error's text only (`mdb_txn_commit: No space left on device`), not its number.
    out_of_space = isinstance(error, lmdb.DiskError) or any(
        os.strerror(code) in str(error) for code in (errno.ENOSPC, errno.EDQUOT)
    )
    if out_of_space or free < INITIAL_MAP_SIZE:
        advice = "the disk is full (or your quota on it): free space there, or write the LMDB to another disk"
    elif limit != resource.RLIM_INFINITY and written + INITIAL_MAP_SIZE > limit:
        advice = (
            f"this process may write files of at most {size_text(limit)} (ulimit -f): raise the limit, or "
            f"write smaller LMDBs"
        )
    else:
        advice = (
            "the disk has room, so it may be failing: see the system log (dmesg) for its errors, and write the"
            " LMDB to another disk"
        )
    return (
        f"LMDB {path}: the write failed after {size_text(written)} ({error}); {size_text(free)} free on its "
        f"disk; {advice}. {path} is as it was, and the part written is removed"
    )


def size_text(size: float) -> str:
    if size < 1024:
        return f"{int(size):,} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def staging_prefix(path: Path) -> str:
    """The start of every staging folder's name for `path`: hidden, and naming this machine, so that
    a writer only judges the processes it can see."""
    return f".{path.name}.staging.{socket.gethostname()}."


def staging_name(path: Path) -> Path:
    """A new name beside `path` that holds this process's id."""
    return path.parent / f"{staging_prefix(path)}{os.getpid()}.{secrets.token_hex(4)}"


def new_staging_folder(path: Path) -> Path:
    """An empty staging folder for `path`, created with os.mkdir's default mode: the umask decides who
    may read the LMDB, as for any other file the user writes (tempfile.mkdtemp's folders are 0700
    whatever the umask: a colleague on a shared server could not read the data)."""
    staging = staging_name(path)
    staging.mkdir()
    return staging


def remove_stale_staging(path: Path) -> None:
    """Remove the staging folders beside `path` whose writer, a process of this machine, has died."""
    prefix = staging_prefix(path)
    for folder in path.parent.glob(glob.escape(prefix) + "*"):
        pid = folder.name[len(prefix) :].partition(".")[0]
        if folder.is_dir() and pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            print(
                f"removed {folder}: a staging folder left by an earlier writer of {path} (process {pid}) that was"
                f" killed before it finished"
            )


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: delivers nothing, only checks
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_replaceable(path: Path, overwrite: bool) -> None:
    """Refuse to write over anything but (with `overwrite`) an LMDB folder or an empty one: never a file
    or a folder of other things (`--out datasets` by mistake); nor where a file stands in for its folder."""
    if path.parent.exists() and not path.parent.is_dir():
        raise FileExistsError(f"{path.parent} is a file, not a folder, so {path} cannot be written: give another --out")
    if not path.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists; remove it or pass --overwrite to replace it")
    if not (path.is_dir() and ((path / "data.mdb").is_file() or not any(path.iterdir()))):
        raise FileExistsError(
            f"{path} exists and is not an LMDB folder (no data.mdb); --overwrite replaces only an"
            f" LMDB: give another path"
        )


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
