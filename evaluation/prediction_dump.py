"""The file `eval.sh --dump` writes, one TSV line per evaluated sample (docs/evaluation.md): its writer, its reader."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import NamedTuple

from evaluation.metrics import is_correct
from utils.atomic_write import write_text_atomically

DUMP_COLUMNS = ("set", "index", "label", "prediction", "confidence", "correct", "char_probs", "metric_mode")
# What a reading of the file needs: which sample, its label, and whether it was read right.
READ_COLUMNS = ("set", "index", "label", "correct")

Scored = dict[str, dict[int, tuple[str, bool | None]]]  # set -> LMDB index -> (label, correct or None)


class Dump(NamedTuple):
    scored: Scored
    # The --metric-mode that decided `correct`; None for a file written before the mode was recorded.
    metric_mode: str | None


def write_dump(path: Path, sets: list[dict], predictions: list[list[tuple]], mode: str, alphabet: str) -> None:
    """One TSV line per evaluated sample, in set and LMDB-index order; `correct` under `mode`."""
    table = io.StringIO()
    writer = csv.writer(table, delimiter="\t", lineterminator="\n")  # fields holding tabs or quotes get quoted
    writer.writerow(DUMP_COLUMNS)
    for row, records in zip(sets, predictions):
        for index, label, reading in records:
            correct = is_correct(reading.text, label, mode, alphabet)
            writer.writerow(
                [
                    row["name"],
                    index,
                    label,
                    reading.text,
                    f"{reading.confidence:.4f}",
                    "" if correct is None else int(correct),
                    " ".join(f"{prob:.4f}" for prob in reading.char_probs),
                    mode,
                ]
            )
    write_text_atomically(path, table.getvalue())


def read_dump(path: Path) -> Dump:
    """Every sample of a `--dump` file by set (in file order) and LMDB index: its label and whether it was
    read right (None: the metric mode left it out); and the metric mode that decided it."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file; write one with scripts/eval.sh CHECKPOINT LMDB ... --dump {path}")
    scored: Scored = {}
    with path.open(newline="", encoding="utf-8") as file:
        rows = csv.reader(file, delimiter="\t")
        header = next(rows, [])
        missing = [column for column in READ_COLUMNS if column not in header]
        if missing:
            raise ValueError(
                f"{path}: not a file of eval.sh --dump (its first line has no {', '.join(missing)} column); "
                f"write one with scripts/eval.sh CHECKPOINT LMDB ... --dump {path}"
            )
        where = {column: header.index(column) for column in READ_COLUMNS}
        mode_column = header.index("metric_mode") if "metric_mode" in header else None
        modes = set()
        for line, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}, line {line}: {len(row)} fields where the header has {len(header)}")
            name, index, label, correct = (row[where[column]] for column in READ_COLUMNS)
            if not index.isdigit() or correct not in ("", "0", "1"):
                raise ValueError(
                    f"{path}, line {line}: index {index!r} and correct {correct!r} should be a whole number and "
                    "1, 0 or empty; the file is not as eval.sh --dump writes it"
                )
            samples = scored.setdefault(name, {})
            if int(index) in samples:
                raise ValueError(f"{path}, line {line}: set {name} index {index} is in the file twice")
            samples[int(index)] = (label, None if correct == "" else correct == "1")
            if mode_column is not None:
                modes.add(row[mode_column])
                if len(modes) > 1:
                    raise ValueError(
                        f"{path}, line {line}: metric modes {' and '.join(sorted(modes))} in one file; "
                        "eval.sh --dump scores a whole file under one --metric-mode"
                    )
    return Dump(scored, modes.pop() if modes else None)
