"""Image files named on a command line: files, folders and (quoted) globs."""

from __future__ import annotations

import glob
from pathlib import Path

from data.lmdb_env import first_index, highest_index, lmdb_for_scan, read_num_samples
from data.lmdb_keys import image_key

# The file names of data.image_formats.READ_FORMATS: a folder's files of another format are not read.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pbm", ".pgm", ".ppm", ".pnm")


def image_paths(inputs: list[str]) -> list[str]:
    """The image files `inputs` name, in order: files as given, folders' image files and globs' files sorted.

    Raises FileNotFoundError naming an input that is missing, an empty folder or a glob matching nothing.
    """
    paths: list[str] = []
    for item in inputs:
        if Path(item).is_dir():
            found = sorted(
                str(path) for path in Path(item).iterdir() if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
            )
            if not found:
                raise FileNotFoundError(f"folder {item} holds no image files ({' '.join(IMAGE_SUFFIXES)})")
        elif Path(item).is_file():
            found = [item]
        elif any(char in item for char in "*?["):  # a glob the shell left alone (quoted)
            found = sorted(path for path in glob.glob(item, recursive=True) if Path(path).is_file())
            if not found:
                raise FileNotFoundError(f"no file matches {item}")
        else:
            raise FileNotFoundError(f"{item} does not exist")
        paths += found
    return list(dict.fromkeys(paths))  # an image named twice (a file inside a folder also given) is read once


def encoded_images(sources: list[str], limit: int) -> list[tuple[str, bytes]]:
    """Up to `limit` (name, encoded image) pairs from image files, folders, globs and LMDB folders (an
    LMDB's samples in order, named `folder#index`)."""
    images: list[tuple[str, bytes]] = []
    for source in sources:
        if (Path(source) / "data.mdb").is_file():
            # This process's environment where it has one: py-lmdb refuses to open a file twice in a process.
            with lmdb_for_scan(source) as env, env.begin() as txn:
                read_num_samples(txn, source)  # a header that is not a count is named, as training names it
                # The keys decide which samples exist, as in training (data/label_index.py).
                for index in range(first_index(txn), highest_index(txn) + 1):
                    if len(images) == limit:
                        break
                    image_bytes = txn.get(image_key(index))
                    if image_bytes is not None:
                        images.append((f"{source}#{index}", bytes(image_bytes)))
        else:
            images += [(path, Path(path).read_bytes()) for path in image_paths([source])[: limit - len(images)]]
    return images[:limit]
