"""Read the text in image files with a trained checkpoint: one `path<TAB>text<TAB>confidence<TAB>char_probs` line each.

    python scripts/predict.py runs/crnn/best.pt word.png                    # one image
    python scripts/predict.py runs/crnn/best.pt scans/ a.jpg b.png          # a folder's image files, and files
    python scripts/predict.py runs/crnn/best.pt 'scans/**/*.png' --device cuda:0 --batch-size 256   # a glob
    python scripts/predict.py runs/crnn/best.pt words/ --decoder lexicon --lexicon synthetic/words/english.txt

The model, alphabet and preprocessing (size, colour, resize filter, normalisation) come from the checkpoint; a
checkpoint trained with data.keep_aspect pads each image only to the next multiple of its data.eval_width_step,
as eval.sh does, and images of one width are read together, so --batch-size never changes a reading. A
folder means the image files directly in it, sorted; a quoted glob is expanded here (`**` recurses).
`char_probs` holds each character's probability, space-separated (the highest in the frames that
emitted it); the word's confidence is their product, length-adjusted as EasyOCR does (prod ** (2 / sqrt(n))),
and 0 for an empty text (data.codec.word_confidence; docs/evaluation.md measures it); calibrated where the
checkpoint holds a temperature (train.calibrate, scripts/calibrate.py), which load_model folds into the model.
`--decoder beam|lexicon` reads with evaluation/decoders.py. An image that cannot be decoded is named on stderr
and skipped; the others are still printed, and the exit status is then 1.
A crop more than 1.5 model input widths long at the model's height (wider than 6:1 for 32 x 128: a long word,
a short line) is read in overlapping pieces whose output frames are stitched (evaluation/long_crops.py), and
stderr says how many were; `--no-split` reads them squashed into the model's input, as eval.sh does.
`--provenance` prints what the checkpoint was trained on (the meta.json of each dataset, docs/data.md): alone
on stdout, beside readings on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from PIL import UnidentifiedImageError
from torch import Tensor

from data.image_files import image_paths
from data.provenance import trained_on
from data.transforms import ImageTransform, build_transform
from evaluation.decoders import Decoder, add_decoder_options, build_decoder
from evaluation.evaluate import read_images
from evaluation.long_crops import LongCropTransform, PiecewiseModel
from training.checkpoint import load_checkpoint, load_model
from training.config import Config, ConfigFileOption, load_config
from training.precision_choice import choose_precision, inference_shape
from utils import cli
from utils.precision import PRECISIONS


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of train.py, or a bare state dict with --config")
    parser.add_argument("inputs", nargs="*", metavar="IMAGE|FOLDER|GLOB", help="image files, folders, quoted globs")
    parser.add_argument(
        "--provenance",
        action="store_true",
        help="print what the checkpoint was trained on (each dataset's name, samples, source, licence): alone, on"
        " stdout; before readings, on stderr",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA if available), cpu, cuda:N, or another accelerator this machine has (mps)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="model inputs per forward pass (default 64; a long crop is one per piece, and is read alone if wider)",
    )
    parser.add_argument(
        "--config",
        action=ConfigFileOption,
        help="model and alphabet for a bare state dict (YAML, or a name in configs/)",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="default auto: the faster of fp32 and bf16 on this machine, measured (a GPU: bf16)",
    )
    add_decoder_options(parser)
    parser.add_argument(
        "--no-split",
        dest="split",
        action="store_false",
        help="read crops over 1.5 input widths long squashed into the input, not in pieces",
    )
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.inputs and not args.provenance:
        parser.error("no image to read: give image files, folders or quoted globs after the checkpoint")
    return args


def resolve_device(name: str) -> torch.device:
    """`auto` is the first GPU when CUDA is available, else the CPU; a device that is not here is an error
    naming the ones that are (before the checkpoint is read: loading onto a missing device would fail
    as if the checkpoint were broken)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"--device {name}: expected auto, cpu or a device here ({', '.join(devices_here())})"
        ) from None
    if device.type != "cpu" and f"{device.type}:{device.index or 0}" not in devices_here():
        raise ValueError(
            f"--device {name}: not available on this machine; the devices here are "
            f"{', '.join(devices_here())} (or --device auto)"
        )
    return device


def devices_here() -> list[str]:
    """The devices this machine can run on: the CPU and each device of its accelerator (CUDA, MPS, ...)."""
    if not torch.accelerator.is_available():
        return ["cpu"]
    kind = torch.accelerator.current_accelerator().type
    return ["cpu", *(f"{kind}:{index}" for index in range(torch.accelerator.device_count()))]


def read_image(path: str, transform: ImageTransform | LongCropTransform) -> Tensor | None:
    """The model's input `[C, H, W]` for the image at `path`, or None after naming it on stderr."""
    try:
        return transform(Path(path).read_bytes())
    except UnidentifiedImageError:  # its message names a BytesIO object, not the file
        reason = "not an image format Pillow reads"
    except Exception as error:  # Pillow raises many types (OSError, ValueError, SyntaxError, ...) on bad files
        reason = str(error) or type(error).__name__
    print(f"{path}: cannot decode ({reason})", file=sys.stderr)
    return None


def batches(
    paths: list[str], inputs: ImageTransform | LongCropTransform, cost: Callable[[Tensor], int], batch_size: int
) -> Iterator[list[tuple[str, Tensor | None]]]:
    """Each path with its model input (None: not decodable), in batches of at most `batch_size` model
    inputs, a long crop counting one per piece (`cost`): a batch of images would let 64 slivers of
    1 x 100000 pixels (63 pieces each) ask for 4,032 inputs in one forward pass. A crop of more pieces
    than `batch_size` is read alone."""
    batch: list[tuple[str, Tensor | None]] = []
    used = 0
    for path in paths:
        image = read_image(path, inputs)
        pieces = 0 if image is None else cost(image)
        if batch and used + pieces > batch_size:
            yield batch
            batch, used = [], 0
        batch.append((path, image))
        used += pieces
    if batch:
        yield batch


@torch.inference_mode()
def predict(
    paths: list[str],
    checkpoint: str,
    device: torch.device,
    batch_size: int,
    config: Config | None = None,
    decoder: str = "greedy",
    lexicon: Path | None = None,
    beam_size: int | None = None,
    precision: str = "auto",
    split: bool = True,
) -> int:
    """Print one line per decodable image of `paths`, long crops read in pieces if `split`; return how many
    could not be decoded."""
    model, codec, config, preprocessing = load_model(checkpoint, device, config)
    decode: Decoder = build_decoder(decoder, codec, lexicon, beam_size)
    # The choice is named on stderr: stdout holds only the readings.
    precision = choose_precision(
        precision,
        device,
        model,
        inference_shape(preprocessing, batch_size),
        training=False,
        log=lambda line: print(line, file=sys.stderr),
        option="--precision",
    )
    transform = build_transform(config, preprocessing)
    long_crops = LongCropTransform(transform)
    inputs = long_crops if split else transform
    reader = PiecewiseModel(model, preprocessing) if split else model  # the model itself for inputs up to its width
    undecodable = in_pieces = 0
    cost = (lambda image: reader.pieces(image.shape[-1])) if split else (lambda image: 1)
    for decoded in batches(paths, inputs, cost, batch_size):
        readable = [(path, image) for path, image in decoded if image is not None]
        undecodable += len(decoded) - len(readable)
        if not readable:
            continue
        in_pieces += sum(image.shape[-1] > transform.width for _, image in readable)  # only a long crop is wider
        readings = read_images(reader, [image for _, image in readable], device, decode, precision)
        for (path, _), reading in zip(readable, readings):
            char_probs = " ".join(f"{prob:.4f}" for prob in reading.char_probs)
            print(f"{path}\t{reading.text}\t{reading.confidence:.4f}\t{char_probs}")
        sys.stdout.flush()  # lines appear batch by batch when piped
    if in_pieces:
        print(
            f"{in_pieces} of {len(paths)} images were wider than {long_crops.split_ratio:.3g}:1 and were read in "
            f"overlapping pieces; --no-split reads them squashed",
            file=sys.stderr,
        )
    return undecodable


def main() -> int:
    args = parse_args()
    if args.provenance:  # stdout holds only readings: beside them, the record goes to stderr
        lines = trained_on(load_checkpoint(args.checkpoint))
        print("\n".join(lines), file=sys.stderr if args.inputs else sys.stdout, flush=True)
    if not args.inputs:
        return 0
    paths = image_paths(args.inputs)
    device = resolve_device(args.device)
    config = load_config(args.config, []) if args.config else None
    undecodable = predict(
        paths,
        args.checkpoint,
        device,
        args.batch_size,
        config,
        args.decoder,
        args.lexicon,
        args.beam_size,
        args.precision,
        args.split,
    )
    if undecodable:
        print(f"{undecodable} of {len(paths)} images could not be decoded and were skipped", file=sys.stderr)
    return 1 if undecodable else 0


if __name__ == "__main__":
    cli.run(main, expected=(ImportError,))  # a missing optional extra (--decoder beam, lexicon): one line
