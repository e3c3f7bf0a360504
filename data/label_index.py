"""Which samples of an LMDB are usable, and why the others are not: the label scan, its report, and
its cache on disk.

Scanning reads every label once: ~40 s for MJSynth + SynthText's 14.4 M, at every start, on every
rank. The result depends only on the LMDB's contents and on what the scan checks (alphabet, case
folding, frames, unknown characters), so it is computed once and kept in a cache folder the user
can write to (never inside the dataset folder, which may be read-only): a later start reads it in
milliseconds. One process builds an entry while the others starting with it wait for it (a file
lock), and an entry is found only by the LMDB's fingerprint, so a changed dataset is scanned again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data.alphabet import describe_character, invisible_characters
from data.codec import CTCCodec, ctc_min_frames
from data.lmdb_env import first_index, highest_index, lmdb_for_scan, read_num_samples
from data.lmdb_keys import image_key, read_label
from utils.atomic_write import write_atomically, write_text_atomically
from utils.cache_home import cache_home
from utils.checks import mistyped_word

DROP_REASONS = ("missing label", "missing image", "empty label", "characters outside the alphabet", "too long for CTC")
# Part of every cache key: bump it when the scan's rules or the entry's layout change.
# 2: samples beyond num-samples are read (version 1 stopped at num-samples); labels are compared with the
# alphabet in composed Unicode form (CTCCodec.normalize)
CACHE_FORMAT = 2


@dataclass
class FilterReport:
    """What filtering kept and dropped in one LMDB, and why."""

    root: str
    total: int  # the indices read: up to the highest sample key, or up to num-samples where it is higher
    num_samples: int  # what the LMDB's header says
    kept: int = 0
    present: int = 0  # indices holding a label or an image: fewer than `total` when keys are missing
    dropped: Counter = field(default_factory=Counter)
    unknown_characters: Counter = field(default_factory=Counter)
    shortened: int = 0  # labels kept without their characters outside the alphabet (remove_unknown)
    source: str = ""  # where the index came from: a scan (and how long it took) or the cache; not in summary()

    def summary(self) -> str:
        reasons = ", ".join(f"{self.dropped[reason]} {reason}" for reason in DROP_REASONS if self.dropped[reason])
        line = f"{self.root}: kept {self.kept} of {self.total}; dropped: {reasons or 'none'}"
        if self.present < self.num_samples:
            line += (
                f"\n  num-samples is {self.num_samples} but only {self.present} samples exist: the LMDB was cut"
                " short or num-samples is wrong (scripts/create_lmdb.py writes it)"
            )
        if self.present > self.num_samples:
            line += (
                f"\n  num-samples is {self.num_samples} but {self.present} samples exist: all of them are read;"
                " num-samples is wrong (scripts/create_lmdb.py writes it)"
            )
        if self.shortened:
            line += f"\n  {self.shortened} labels lost characters outside the alphabet (removed, not dropped)"
        if self.unknown_characters:
            common = " ".join(f"{describe_character(char)}x{n}" for char, n in self.unknown_characters.most_common(10))
            line += f"\n  characters outside the alphabet (most common): {common}"
        invisible = invisible_characters("".join(self.unknown_characters))
        if invisible:
            names = ", ".join(describe_character(char) for char in invisible)
            line += (
                f"\n  {len(invisible)} of them print nothing ({names}): those labels look right and are not;"
                " remove these characters from them (or, where the script writes one, list it in data.alphabet)"
            )
        return line

    def to_json(self) -> dict:
        return {
            "total": self.total,
            "num_samples": self.num_samples,
            "kept": self.kept,
            "present": self.present,
            "dropped": dict(self.dropped),
            "unknown_characters": dict(self.unknown_characters),
            "shortened": self.shortened,
        }

    @classmethod
    def from_json(cls, root: str, record: dict, source: str) -> FilterReport:
        return cls(
            root,
            record["total"],
            record["num_samples"],
            record["kept"],
            record["present"],
            Counter(record["dropped"]),
            Counter(record["unknown_characters"]),
            record["shortened"],
            source,
        )


def scan_labels(
    root: str | Path, codec: CTCCodec, max_frames: int, remove_unknown: bool = False
) -> tuple[np.ndarray, FilterReport]:
    """Read every label once; return the indices (1-based) of the usable samples and a report.

    A sample is usable when its image key exists (it is not decoded here) and its label is non-empty,
    every character is in the alphabet, and CTC can align it to `max_frames` frames (a repeated
    character needs a blank between its two frames). With `remove_unknown`, characters outside the
    alphabet are removed from a label instead of dropping it, as the benchmarks' protocol does.
    """
    started = time.perf_counter()
    # buffers=True: values come back as views into the memory map, so looking up an image key to see
    # that it exists reads no image bytes.
    with lmdb_for_scan(root) as env, env.begin(buffers=True) as txn:
        num_samples = read_num_samples(txn, root)
        # The keys decide, not the header: samples past num-samples are read too (a converter that
        # miscounted, or an LMDB appended to), and so is a sample at index 0 (a converter counting from
        # 0). A num-samples of 10**12 does not make this loop run for hours: the indices past the
        # highest key hold nothing, counted as missing without a lookup each.
        first, last = first_index(txn), highest_index(txn)
        read = last - first + 1
        report = FilterReport(root=str(root), total=max(num_samples, read), num_samples=num_samples)
        if num_samples > read:
            report.dropped["missing label"] += num_samples - read
        # Filled in place, not a list of Python ints: 14.4 M of those would hold ~500 MB at the peak.
        kept = np.empty(read, dtype=np.int32 if last < 2**31 else np.int64)
        for index in range(first, last + 1):
            label = read_label(txn, index)
            label = None if label is None else codec.normalize(label)
            has_image = txn.get(image_key(index)) is not None
            report.present += label is not None or has_image
            reason = drop_reason(label, has_image, codec, max_frames, remove_unknown, report)
            if reason:
                report.dropped[reason] += 1
            else:
                kept[report.kept] = index
                report.kept += 1
    refuse_without_usable_samples(report)
    report.source = f"labels scanned in {time.perf_counter() - started:.1f} s"
    # A numpy array: forked workers share it instead of copying it on read, as they would a list.
    return kept[: report.kept].copy(), report


def drop_reason(
    label: str | None, has_image: bool, codec: CTCCodec, max_frames: int, remove_unknown: bool, report: FilterReport
) -> str | None:
    """Why a sample is not usable (one of DROP_REASONS), or None when it is. Its characters outside the
    alphabet are counted in `report`, and so is a label they were removed from (`remove_unknown`)."""
    if label is None:
        return "missing label"
    if not has_image:
        return "missing image"
    unknown = codec.unknown_characters(label)
    if unknown and remove_unknown:
        report.unknown_characters.update(char for char in label if char in unknown)
        report.shortened += 1
        label, unknown = codec.remove_unknown(label), set()
    if not label:
        return "empty label"
    if unknown:
        report.unknown_characters.update(char for char in label if char in unknown)
        return "characters outside the alphabet"
    if ctc_min_frames(label) > max_frames:
        return "too long for CTC"
    return None


def refuse_without_usable_samples(report: FilterReport) -> None:
    """Raise when the scan found no sample, or none usable: training would draw from nothing, and
    evaluation would score nothing as 0 %."""
    root = report.root
    if not report.present:
        raise ValueError(
            f"{root}: the LMDB holds no samples under the format's keys (image-000000001, "
            f"label-000000001, ...; num-samples is {report.num_samples}): nothing to train or evaluate "
            f"on; give an LMDB with samples (scripts/create_lmdb.py writes one; scripts/inspect_lmdb.py "
            f"lists the keys this one has)"
        )
    if not report.kept:
        raise ValueError(
            f"{report.summary()}\n  no sample of {root} is usable (why: above), so there is nothing to"
            f" train or evaluate on; scripts/inspect_lmdb.py --alphabet shows its labels beside one"
        )


INDEX_CACHE_WORDS = ("auto", "off")  # what data.index_cache takes besides a folder (index_cache_dir)


def index_cache_dir(setting: str) -> Path | None:
    """data.index_cache's folder: `auto` is the user's cache folder ($XDG_CACHE_HOME or ~/.cache, then
    crnn-ocr/lmdb-index), `off` none, anything else the folder itself."""
    if setting == "off":
        return None
    if setting == "auto":
        return cache_home() / "lmdb-index"
    folder = Path(setting).expanduser()
    # A word mistyped (`of`, `Auto`) would otherwise be a new folder of that name in the working directory.
    meant = mistyped_word(setting, INDEX_CACHE_WORDS)
    if meant:
        raise ValueError(
            f"index cache {setting!r}: unknown setting (did you mean {meant!r}?); data.index_cache and "
            f"--index-cache take {', '.join(INDEX_CACHE_WORDS)} or a folder (./{setting} for a new folder of that name)"
        )
    return folder


def usable_samples(
    root: str | Path, codec: CTCCodec, max_frames: int, remove_unknown: bool = False, cache_dir: Path | None = None
) -> tuple[np.ndarray, FilterReport]:
    """scan_labels's answer, from `cache_dir` when it holds one for this LMDB's contents and these
    settings; otherwise scanned and stored there. The indices come back memory-mapped from the cache
    file: every process on the machine then shares one copy in the page cache."""
    if cache_dir is None:
        return scan_labels(root, codec, max_frames, remove_unknown)
    settings = {
        "format": CACHE_FORMAT,
        "lmdb": lmdb_fingerprint(root),
        "alphabet": codec.alphabet,
        "fold_case": codec.fold_case,
        "max_frames": max_frames,
        "remove_unknown": remove_unknown,
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]
    entry = cache_dir / key
    try:
        found = read_entry(entry, settings, root)
    except UnusableEntry:  # read again, and said, under the lock: another process may be rewriting it
        found = None
    if found:
        return found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(entry.with_suffix(".lock")):
            # Another process (another rank starting with this one) may have built it while this one waited.
            unusable = ""
            try:
                found = read_entry(
                    entry, settings, root, source=f"index built by another process, read from {entry}.npy"
                )
            except UnusableEntry as error:
                unusable = f" (the cached index {entry}.npy was not usable, so it was built again: {error})"
            if found:
                return found
            kept, report = scan_labels(root, codec, max_frames, remove_unknown)
            report.source += unusable
            write_entry(entry, settings, kept, report)
    except OSError as error:  # a cache folder that cannot be written: scan, and say how to fix it
        kept, report = scan_labels(root, codec, max_frames, remove_unknown)
        report.source += (
            f"; not cached: {error.strerror or error} ({cache_dir}); set data.index_cache to a "
            f"writable folder, or to off"
        )
        return kept, report
    # Read back memory-mapped like any later start; the scan's own array if the file cannot be mapped.
    try:
        return read_entry(entry, settings, root, source=f"{report.source}, cached in {entry}.npy") or (kept, report)
    except UnusableEntry:
        return kept, report


def lmdb_fingerprint(root: str | Path) -> dict:
    """What changes whenever the LMDB's contents do: every write transaction moves last_txnid, and a
    rebuilt or replaced file has another inode or modification time."""
    data_file = Path(root) / "data.mdb"
    with lmdb_for_scan(root) as env:
        last_txnid = env.info()["last_txnid"]
    stat = data_file.stat()
    return {
        "path": os.path.realpath(data_file),
        "device": stat.st_dev,
        "inode": stat.st_ino,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "last_txnid": last_txnid,
    }


def read_entry(
    entry: Path, settings: dict, root: str | Path, source: str | None = None
) -> tuple[np.ndarray, FilterReport] | None:
    """The cached index and report; None when there is no entry (its record, written last, is missing);
    UnusableEntry when there is one that fails check_entry (cut short by a crash or a full disk, edited,
    or written by another program): it is scanned again and written anew, and the log line says why."""
    try:
        text = entry.with_suffix(".json").read_bytes()
    except OSError:  # none there, or a cache folder that cannot be read (the write that follows says so)
        return None
    try:
        record = json.loads(text.decode("utf-8"))
        kept = np.load(entry.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UnusableEntry(f"unreadable: {error}") from None
    check_entry(record, settings, kept, root)
    return kept, FilterReport.from_json(str(root), record["report"], source or f"index read from {entry}.npy")


class UnusableEntry(Exception):
    """A cached entry that is there but cannot be believed; its message says why."""


REPORT_COUNTS = ("total", "num_samples", "kept", "present", "shortened")


def check_entry(record: Any, settings: dict, kept: np.ndarray, root: str | Path) -> None:
    """What can be checked cheaply, once, when an entry is read: that it is for these settings, that its
    report holds counts, and that its indices are indices of this LMDB, each once and in order (what the
    sampler and the loaders assume). One pass over the array: ~20 ms for 14.4 M samples."""
    if not isinstance(record, dict) or record.get("settings") != settings:
        raise UnusableEntry("its record is not for this LMDB and these settings")
    report = record.get("report")
    if not (
        isinstance(report, dict)
        and all(type(report.get(name)) is int and report[name] >= 0 for name in REPORT_COUNTS)
        and all(
            isinstance(report.get(name), dict) and all(type(count) is int for count in report[name].values())
            for name in ("dropped", "unknown_characters")
        )
    ):
        raise UnusableEntry("its report does not hold counts")
    if kept.ndim != 1 or not np.issubdtype(kept.dtype, np.integer):
        raise UnusableEntry(f"its indices are a {kept.ndim}-D array of {kept.dtype}, not a list of integers")
    if len(kept) != report["kept"] or not len(kept):
        raise UnusableEntry(f"it holds {len(kept)} indices and its report counts {report['kept']}")
    if not bool(np.all(kept[1:] > kept[:-1])):
        position = int(np.argmin(kept[1:] > kept[:-1])) + 1
        raise UnusableEntry(f"its indices are not in increasing order (position {position}: {kept[position]})")
    with lmdb_for_scan(root) as env, env.begin(buffers=True) as txn:
        first, last = first_index(txn), highest_index(txn)
    if kept[0] < first or kept[-1] > last:
        raise UnusableEntry(f"its indices run from {kept[0]} to {kept[-1]}, and the LMDB's from {first} to {last}")


def write_entry(entry: Path, settings: dict, kept: np.ndarray, report: FilterReport) -> None:
    """The array, then the record that vouches for it, each written whole and renamed into place."""
    write_atomically(entry.with_suffix(".npy"), lambda file: np.save(file, kept, allow_pickle=False))
    write_text_atomically(
        entry.with_suffix(".json"), json.dumps({"settings": settings, "report": report.to_json()}, indent=1)
    )


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time on this machine (and across machines on a shared file system
    that supports flock): the others block here until it is released."""
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
