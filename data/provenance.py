"""Where a dataset came from: the optional `meta.json` inside an LMDB folder, and the record of them that a run
keeps (RUN/data_provenance.json and every checkpoint's `provenance`), so that a model, forked or not, says what
it was trained on.

An LMDB is a folder (data.mdb, lock.mdb), so "beside the LMDB" means inside that folder: meta.json travels
with the folder when it is copied, and readers of the format ignore it. Every field is optional (a hand-written
`{"source": ..., "licence": ...}` will do), but a field that is there must be of its type:

    name        what the dataset is called
    source      where its images and labels came from: a URL or words
    licence     the terms it may be used under
    created_by  the command line that wrote it
    created     when, in UTC (ISO 8601)
    samples     how many samples it holds
    notes       anything else
    generator   make_synthetic.py's settings (seed, word list, fonts and their licences)
    sources     split_lmdb.py's: the records of the LMDBs it was split from, each with its `path`

A run's record is `{"datasets": [{"role", "path", "meta"}], "started_from": {"checkpoint", "provenance"}}`,
`meta` null where an LMDB has no meta.json, `started_from` null unless train.init_from gave the start.
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from utils.atomic_write import write_text_atomically

META_FILE = "meta.json"
NOT_GIVEN = "not given"

FIELD_TYPES: dict[str, tuple[type, str]] = {
    "name": (str, "text"),
    "source": (str, "text"),
    "licence": (str, "text"),
    "created_by": (str, "text"),
    "created": (str, "text"),
    "samples": (int, "a count (an integer, 0 or more)"),
    "notes": (str, "text"),
    "generator": (dict, "a mapping"),
    "sources": (list, "a list of records (mappings)"),
}


class MetaError(ValueError):
    """A meta.json that cannot be used: one line naming the file, the field and what to do."""


def meta_path(lmdb: str | Path) -> Path:
    return Path(lmdb) / META_FILE


def new_meta(name: str, source: str | None, licence: str | None, **fields: Any) -> dict[str, Any]:
    """A record for a dataset this process writes: who wrote it (this command line) and when. `samples` is
    added by write_meta's caller once it is known."""
    return {
        "name": name,
        "source": source or NOT_GIVEN,
        "licence": licence or NOT_GIVEN,
        "created_by": shlex.join(sys.argv),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    }


def write_meta(lmdb: str | Path, meta: dict[str, Any]) -> None:
    """meta.json into the LMDB folder `lmdb` (a staging folder while it is built), replaced atomically."""
    write_text_atomically(meta_path(lmdb), json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


def read_meta(lmdb: str | Path) -> dict[str, Any] | None:
    """The LMDB's meta.json, checked; None if it has none (provenance is optional)."""
    path = meta_path(lmdb)
    if not path.is_file():
        return None
    fix = f"fix {path} (or remove it: provenance is optional)"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MetaError(f"{path}: not JSON ({error}); {fix}") from None
    if not isinstance(meta, dict):
        raise MetaError(f"{path}: holds {type(meta).__name__}, not a mapping of fields; {fix}")
    problem = field_problem(meta)
    if problem:
        raise MetaError(f"{path}: {problem}; {fix}")
    return meta


def field_problem(meta: dict[str, Any]) -> str | None:
    """The first field of `meta` that is not of its type, described; None if all are."""
    for name, (kind, what) in FIELD_TYPES.items():
        if name not in meta:
            continue
        value = meta[name]
        fits = isinstance(value, kind) and not isinstance(value, bool)
        if name == "samples":
            fits = fits and value >= 0
        if name == "sources":
            fits = fits and all(isinstance(item, dict) for item in value)
        if not fits:
            return f"its '{name}' is {value!r} ({type(value).__name__}), not {what}"
    return None


def run_record(
    train: list[str], val: list[str], started_from: str | None = None, start_record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a run trains and validates on: the meta.json of every data.train and data.val LMDB (a MetaError
    names a bad one), and, for a fine-tune, the start checkpoint's own record (`start_record`, None where it has
    none), so that a model fine-tuned from a synthetic-trained one says both."""
    datasets = [
        {"role": role, "path": str(root), "meta": read_meta(root)}
        for role, roots in (("train", train), ("val", val))
        for root in roots
    ]
    start = {"checkpoint": str(started_from), "provenance": start_record} if started_from else None
    return {"datasets": datasets, "started_from": start}


def imported_record(file: str, source: str | None, licence: str | None) -> dict[str, Any]:
    """The record of weights scripts/import_weights.py converted from another project's `file`: what the user
    says of them, as the one thing they were trained on."""
    meta = new_meta(file, source, licence)
    return {"datasets": [{"role": "imported", "path": file, "meta": meta}], "started_from": None}


def resumed_record(current: dict[str, Any], kept: dict[str, Any] | None) -> dict[str, Any]:
    """A resumed run's record: the one its checkpoint kept (what its earlier steps trained on, and where they
    started), with this run's datasets added where they are new (data.train changed on resume)."""
    if not is_record(kept):
        return current
    seen = {(dataset["role"], dataset["path"]) for dataset in kept["datasets"]}
    added = [dataset for dataset in current["datasets"] if (dataset["role"], dataset["path"]) not in seen]
    return {**kept, "datasets": [*kept["datasets"], *added]}


def is_record(value: Any) -> bool:
    """Whether `value` is a run's record as run_record writes it (checkpoint.py's FIELDS check of `provenance`)."""
    if not isinstance(value, dict) or not isinstance(value.get("datasets"), list):
        return False
    datasets_fit = all(
        isinstance(dataset, dict)
        and isinstance(dataset.get("role"), str)
        and isinstance(dataset.get("path"), str)
        and (dataset.get("meta") is None or isinstance(dataset["meta"], dict))
        for dataset in value["datasets"]
    )
    start = value.get("started_from")
    start_fits = start is None or (
        isinstance(start, dict)
        and isinstance(start.get("checkpoint"), str)
        and (start.get("provenance") is None or is_record(start["provenance"]))
    )
    return datasets_fit and start_fits


def trained_on(checkpoint: dict[str, Any]) -> list[str]:
    """What a checkpoint says it was trained on, as lines to print (eval.py and predict.py --provenance)."""
    imported = checkpoint.get("imported_from")
    where = f" (imported from {imported.get('file')} by scripts/import_weights.py)" if imported else ""
    return describe_record(checkpoint.get("provenance"), where)


def describe_record(record: dict[str, Any] | None, where: str = "") -> list[str]:
    """A run's record as lines: one per dataset (role, path, name, samples, source, licence), then what a
    fine-tune started from, indented."""
    if record is None:
        return [f"no provenance recorded{where}: the checkpoint does not say what it was trained on"]
    lines = ["trained on:"]
    for dataset in record["datasets"]:
        lines.append(f"  {dataset['role']} {dataset['path']}: {describe_meta(dataset['meta'])}")
    start = record.get("started_from")
    if start:
        lines.append(f"started from {start['checkpoint']}, which was")
        lines.extend("  " + line for line in describe_record(start["provenance"]))
    return lines


def describe_meta(meta: dict[str, Any] | None) -> str:
    if meta is None:
        return "no meta.json"
    samples = meta.get("samples")
    parts = [
        str(meta.get("name", meta.get("path", "unnamed"))),
        f"{samples} samples" if samples is not None else "samples not given",
        f"source {meta.get('source', NOT_GIVEN)}",
        f"licence {meta.get('licence', NOT_GIVEN)}",
    ]
    return ", ".join(parts)
