"""Convert another project's CRNN checkpoint into this project's: prefix-free, loadable with
`torch.load(weights_only=True)`, recording the architecture, the characters and the source's preprocessing.

    python scripts/import_weights.py english_g2.pth --out pretrained/english_g2.pt              # EasyOCR
    python scripts/import_weights.py None-VGG-BiLSTM-CTC.pth --out pretrained/dtrb.pt           # DTRB
    python scripts/import_weights.py crnn.pth --out pretrained/crnn_pytorch.pt --format crnn.pytorch
    python scripts/import_weights.py my_g2.pth --out my.pt --alphabet my_characters.txt           # own set

--format auto recognises EasyOCR's generation-2 recognizers, deep-text-recognition-benchmark's
None-VGG-BiLSTM-CTC and crnn.pytorch's CRNN from their key layout (interop/peer_weights.py) and says
which it chose. Their files hold no character list: the published models' sets are known by their
class count; any other needs --alphabet, the characters in the source's class order (the blank, class
0, not listed). The result then works with eval.sh, predict.py, export.py, and train.init_from.
`--trained-on TEXT --licence TEXT` record what you know of the weights' origin (eval.sh and predict.py
--provenance print it); without them the checkpoint says it records none.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from data.alphabet import load_alphabet
from data.provenance import imported_record
from data.transforms import Preprocessing
from interop.peer_weights import (
    FORMATS,
    convert_state_dict,
    detect_format,
    imported_config,
    model_settings,
    source_alphabet,
)
from models import count_parameters, model_from_config, output_frames
from training.checkpoint import load_checkpoint, save_checkpoint, weights_checkpoint
from utils import cli


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the other project's checkpoint (.pth)")
    parser.add_argument("--out", type=Path, required=True, help="this project's checkpoint to write (.pt)")
    parser.add_argument(
        "--format", default="auto", choices=["auto", *FORMATS], help="the source's layout (default auto)"
    )
    parser.add_argument(
        "--alphabet", help="the source's characters in class order: a string, or a file with one per line"
    )
    parser.add_argument(
        "--trained-on", help="where the weights came from and what they were trained on (a URL or words)"
    )
    parser.add_argument("--licence", help="the terms the weights may be used under")
    return parser.parse_args()


def check_out(out: Path, source: Path) -> None:
    """--out may replace an earlier import, never the source, a folder or another file (a trained best.pt)."""
    if out.resolve() == source.resolve():
        raise ValueError(f"--out {out} is the source itself")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file, e.g. --out {out / source.with_suffix('.pt').name}")
    if out.exists() and not is_import(out):
        raise ValueError(
            f"--out {out} exists and is not a checkpoint this script wrote (a trained checkpoint would be"
            " lost); remove it or give another --out"
        )


def is_import(path: Path) -> bool:
    try:
        return "imported_from" in load_checkpoint(path)
    except (OSError, ValueError):  # not a checkpoint at all
        return False


def main() -> int:
    args = parse_args()
    check_out(args.out, args.source)
    checkpoint = load_checkpoint(args.source)  # weights only; `module.` and `_orig_mod.` stripped
    if "config" in checkpoint:
        raise ValueError(f"{args.source} is already a checkpoint of this project; use it as it is")
    source = checkpoint["model"]
    if args.format == "auto":
        peer, reason = detect_format(source)
        print(f"format: {peer.name} ({reason})")
    else:
        peer = FORMATS[args.format]
        absent = [key for key in peer.signature if key not in source]
        if absent:
            raise ValueError(
                f"{args.source} is not in the {peer.name} layout: it lacks {', '.join(absent)}; the first "
                f"keys found: {', '.join(list(source)[:6])} (try --format auto)"
            )
        print(f"format: {peer.name} (--format)")

    model_section = model_settings(peer, source)
    classes = source[f"{peer.classifier}.weight"].shape[0]
    given = load_alphabet(args.alphabet) if args.alphabet else None
    alphabet, fold_case, alphabet_origin = source_alphabet(peer, classes, given)
    config = imported_config(peer, model_section, alphabet, fold_case)
    model = model_from_config(config.model, classes)
    weights, report = convert_state_dict(peer, source, model.state_dict())
    model.load_state_dict(weights, strict=True)
    preprocessing = Preprocessing.from_config(config)
    frames = output_frames(model, preprocessing.channels, preprocessing.height, preprocessing.width)

    # What the other project trained on is not in its file: only what the user says of it.
    said = args.trained_on or args.licence
    provenance = imported_record(args.source.name, args.trained_on, args.licence) if said else None
    imported = weights_checkpoint(
        model, config, alphabet, preprocessing, step=0, accuracy=None, world_size=1, provenance=provenance
    )
    imported["imported_from"] = {"format": peer.name, "file": args.source.name}
    save_checkpoint(args.out, imported)

    described = ", ".join(f"{key}={value}" for key, value in model_section.items())
    print(
        f"model: {described}; {count_parameters(model):,} parameters, {frames} frames at " f"{preprocessing.width} px"
    )
    print("\n".join(report))
    print(
        f"characters: {len(alphabet)} from {alphabet_origin}, blank at class 0"
        f"{'; labels lowercased (fold_case)' if fold_case else ''}"
    )
    print(f"preprocessing: {preprocessing.to_dict()}; evaluation pads to multiples of {peer.eval_width_step} px")
    print(
        f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB). Next: scripts/eval.sh {args.out} LMDB ..., "
        f"python scripts/predict.py {args.out} IMAGES, or train from it with train.init_from={args.out}"
    )
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    cli.run(main)
