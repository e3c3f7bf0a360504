"""Training-time augmentation: seeded per sample, off in validation, evaluation and prediction."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from data.augment import (
    AUGMENTATIONS,
    LEVELS,
    PROBABILITIES,
    Augmentation,
    SampleRandom,
    affine,
    homographies,
    mix32,
    warp,
)
from data.codec import CTCCodec
from data.lmdb_dataset import CollateBatch, LmdbDataset, SeededSamples
from data.samplers import GlobalBatchSampler
from data.transforms import DeviceTransform, ImageTransform, Preprocessing
from tests.conftest import ALPHABET, REPO, read_lmdb, run_env, write_images
from training.checkpoint import load_checkpoint, load_model, save_checkpoint
from training.config import AugmentConfig, ConfigError, load_config, validate


def test_levels_set_the_probabilities_and_the_augment_section_overrides_them():
    assert Augmentation.from_config("none", {}) is None
    light = Augmentation.from_config("light", {"blur": 0.0, "invert": None})
    assert light.probabilities == {**PROBABILITIES["light"], "blur": 0.0}
    assert Augmentation.from_config("none", {"noise": 0.5}).probabilities == {**PROBABILITIES["none"], "noise": 0.5}
    config = load_config("crnn.yaml", ["data.augment=strong", "augment.blur=0.9", "augment.invert=null"])
    assert config.augment.blur == 0.9 and config.augment.invert is None
    validate(config)
    for override, message in (
        ("data.augment=heavy", "data.augment: 'heavy' is not one of none, light, strong"),
        ("augment.blur=1.5", r"augment.blur=1.5: must be from 0 to 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            validate(load_config("crnn.yaml", [override]))


def test_the_augment_section_has_a_key_for_each_entry_of_the_table():
    assert [item.name for item in dataclasses.fields(AugmentConfig)] == [step.name for step in AUGMENTATIONS]
    assert list(PROBABILITIES) == list(LEVELS)


@pytest.mark.slow
def test_an_augmentation_added_to_the_table_is_configured_and_applied_with_no_other_change(synth):
    """What a fork writes: one entry in data/augment.py's table. Its `augment.<name>` key is then read,
    checked and applied, with no line changed anywhere else."""
    script = '''if True:
        import pathlib, sys, types, torch
        # The fork's data/augment.py: this one with one entry more, imported before anything reads it.
        entry = """AUGMENTATIONS = (
            AugmentationStep("erase", probability={"none": 0.0, "light": 0.0, "strong": 0.0},
                             apply=lambda pixels, widths, strength, random: pixels.index_fill(
                                 3, torch.arange(8, device=pixels.device), 0)),"""
        source = pathlib.Path("data/augment.py").read_text().replace("AUGMENTATIONS = (", entry, 1)
        sys.modules["data.augment"] = fork = types.ModuleType("data.augment")
        exec(compile(source, "data/augment.py", "exec"), fork.__dict__)
        from data.transforms import build_device_transform, build_transform
        from training.config import ConfigError, load_config, validate
        config = load_config("crnn.yaml", ["data.augment=none", "augment.erase=1"])
        validate(config)
        transform = build_transform(config, train=True)
        device_transform = build_device_transform(config, transform)
        assert device_transform.augmentation.probabilities == {**fork.PROBABILITIES["none"], "erase": 1.0}
        pixels, width = transform.to_uint8(transform.decode(pathlib.Path(sys.argv[1]).read_bytes()))
        erased = device_transform(pixels[None], torch.tensor([width]), torch.tensor([1]))
        assert erased[..., :8].eq(-1).all() and not torch.equal(erased, transform.normalize(pixels[None].float()))
        try:
            validate(load_config("crnn.yaml", ["augment.erase=2"]))
        except ConfigError as error:
            print(error)
    '''
    image = write_images(synth, synth.parent / "erase", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", script, str(image)], cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "augment.erase=2.0: must be from 0 to 1"


def training_pixels(transform: ImageTransform, encoded: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """What training's workers hand over for these images: uint8 pixels `[B, C, H, W]` and their widths."""
    pixels, widths = zip(*(transform.to_uint8(transform.decode(image)) for image in encoded))
    return torch.stack(pixels), torch.tensor(widths)


@pytest.mark.slow
def test_a_sample_s_augmentation_depends_on_its_seed_alone(synth):
    encoded = [image for image, _ in read_lmdb(synth / "train")[:4]]
    transform = ImageTransform(Preprocessing(32, 256, keep_aspect=True, max_stretch=1.0))
    strong = DeviceTransform(transform, Augmentation.from_config("strong", {}))
    pixels, widths = training_pixels(transform, encoded)
    assert widths.lt(256).any()  # some are narrower than the batch: their padding is part of what is checked
    torch.manual_seed(123)
    global_state = torch.get_rng_state()
    seeds = torch.tensor([7, 8, 9, 10])
    first, again = strong(pixels, widths, seeds), strong(pixels, widths, seeds)
    assert torch.equal(torch.get_rng_state(), global_state)  # drawn from the sample's seed, not global state
    assert torch.equal(first, again)
    # In any batch, in any place: the same image from the same seed.
    for place in range(4):
        alone = strong(pixels[place : place + 1], widths[place : place + 1], seeds[place : place + 1])
        assert torch.equal(alone[0], first[place])
        reordered = strong(pixels.flip(0), widths.flip(0), seeds.flip(0))
        assert torch.equal(reordered[3 - place], first[place])
    others = [strong(pixels[:1], widths[:1], torch.tensor([seed]))[0] for seed in range(11, 19)]
    assert sum(not torch.equal(first[0], other) for other in others) >= 6  # most seeds draw some transform
    plain = torch.stack([transform(image) for image in encoded])  # evaluation's path: no augmentation
    assert torch.equal(DeviceTransform(transform, None)(pixels, widths, seeds), plain)
    assert first.shape == plain.shape and first.min() >= -1 and first.max() <= 1


def test_a_narrow_image_in_a_wide_batch_is_augmented_as_it_would_be_alone():
    """Padding is not part of the image: the geometry turns about its own centre and fills with its own
    border, the blur mirrors at its own edge, and the padding repeats its augmented last column."""
    every_but_noise = Augmentation("strong", {name: float(name != "noise") for name in PROBABILITIES["strong"]})
    image = torch.rand(1, 1, 32, 60)
    image[..., 10:22, 15:45] = 1 - image[..., 10:22, 15:45]
    padded = torch.cat([image, image[..., -1:].expand(1, 1, 32, 40)], dim=3)
    seeds = torch.tensor([5])
    alone = every_but_noise(image.clone(), torch.tensor([60]), seeds)
    in_batch = every_but_noise(padded, torch.tensor([60]), seeds)
    assert torch.allclose(in_batch[..., :60], alone, atol=1e-4)  # the grid computed for another width rounds apart
    assert torch.equal(in_batch[..., 60:], in_batch[..., 59:60].expand(1, 1, 32, 40))


def test_geometry_fills_the_corners_it_uncovers_with_the_image_s_own_border_colour():
    """Each image's own border colour, whichever images are beside it; every draw from the sample's seed."""
    every = {name: 0.0 for name in PROBABILITIES["strong"]}
    images = torch.stack([torch.full((1, 32, 100), value) for value in (0.0, 1.0, 0.3)])
    images[:, :, 12:20, 20:80] = 1 - images[:, :, 12:20, 20:80]  # a "word" across the middle
    widths = torch.tensor([100, 100, 100])
    for geometry in ("affine", "perspective"):
        augmentation = Augmentation("strong", every | {geometry: 1.0})
        outputs = augmentation(images.clone(), widths, torch.tensor([3, 3, 3]))
        again = augmentation(images.flip(0), widths, torch.tensor([3, 3, 3])).flip(0)
        for image, output, repeated in zip(images, outputs, again):
            assert torch.equal(output, repeated)
            assert not torch.equal(output, image)
            assert output[0, [0, 0, -1, -1], [0, -1, 0, -1]].eq(image[0, 0, 0]).all(), geometry  # corners: its border
            word, background = image[0, 16, 50], image[0, 0, 0]
            assert output[0, 14:18, 30:70].sub(word).abs().mean() < (word - background).abs() / 2  # still there


def test_an_identity_warp_returns_the_image_and_a_shift_moves_it():
    image, widths = torch.rand(1, 3, 32, 100), torch.tensor([100])
    identity = torch.eye(3)[None]
    assert torch.allclose(warp(image, widths, identity), image, atol=1e-5)
    # Sampling the source 3 pixels to the right moves the content 3 pixels to the left.
    moved = warp(image, widths, torch.tensor([[[1.0, 0, 3], [0, 1, 0], [0, 0, 1]]]))
    assert torch.allclose(moved[..., :97], image[..., 3:], atol=1e-5)


def test_the_affine_moves_the_content_as_its_strength_says_about_the_centre():
    image, widths = torch.zeros(1, 1, 32, 100), torch.tensor([100])
    image[0, 0, 15:17, 69:71] = 1  # a dot 20 pixels right of the centre (50, 16)
    still = {"degrees": 0, "shear": 0, "scale": (1, 1), "translate": (0, 0)}
    assert torch.allclose(affine(image, widths, still, SampleRandom(torch.tensor([0]), 1)), image, atol=1e-5)
    half = affine(image, widths, still | {"scale": (0.5, 0.5)}, SampleRandom(torch.tensor([0]), 1))
    assert half[0, 0].sum(dim=0).argmax().item() in (59, 60) and half[0, 0].sum(dim=1).argmax().item() in (15, 16)
    # An image 60 wide in a batch 100 wide turns about its own centre (30, 16): the dot at 40 goes to 35.
    image, widths = torch.zeros(1, 1, 32, 100), torch.tensor([60])
    image[0, 0, 15:17, 39:41] = 1
    half = affine(image, widths, still | {"scale": (0.5, 0.5)}, SampleRandom(torch.tensor([0]), 1))
    assert half[0, 0].sum(dim=0).argmax().item() in (34, 35)


def test_every_transform_takes_an_image_resized_to_one_or_two_pixels_wide():
    """A tall crop resized to the model's height can be that narrow; torchvision's blur refused it."""
    every = Augmentation("strong", {name: 1.0 for name in PROBABILITIES["strong"]})
    widths = torch.tensor([1, 2, 3])
    output = every(torch.rand(3, 1, 32, 8), widths, torch.tensor([1, 2, 3]))
    assert output.shape == (3, 1, 32, 8) and output.min() >= 0 and output.max() <= 1
    for image, width in zip(output, widths.tolist()):
        assert torch.equal(image[..., width:], image[..., width - 1 : width].expand(1, 32, 8 - width))


def test_a_perspective_homography_takes_each_corner_where_it_was_asked():
    moved = torch.tensor([[[3.0, 2.0], [95.0, 1.0], [97.0, 30.0], [1.0, 31.0]]])
    corners = torch.tensor([[[0.0, 0.0], [100.0, 0.0], [100.0, 32.0], [0.0, 32.0]]])
    matrix = homographies(moved, corners)[0]
    for point, corner in zip(moved[0], corners[0]):
        x, y, depth = matrix @ torch.tensor([*point, 1.0])
        assert torch.allclose(torch.stack([x / depth, y / depth]), corner, atol=1e-3)


def test_the_hash_is_lowbias32_to_the_bit_with_no_int64_overflow():
    """Written out in Python's unbounded integers, the reference the tensor version must match."""

    def reference(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    values = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789, 0xDEADBEEF]
    assert mix32(torch.tensor(values)).tolist() == [reference(value) for value in values]


def test_sample_random_draws_are_evenly_spread_and_each_sample_s_own():
    seeds = torch.arange(1000) * 7919
    random = SampleRandom(seeds, stream=3)
    uniform, normal = random.uniform((100,)), random.normal((100,))
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean().item() - 0.5) < 0.01
    assert abs(normal.mean().item()) < 0.01 and abs(normal.std().item() - 1) < 0.01
    again = SampleRandom(seeds[500:], stream=3)  # a subset draws what it drew in the whole batch
    assert torch.equal(again.uniform((100,)), uniform[500:]) and torch.equal(again.normal((100,)), normal[500:])
    assert not torch.equal(SampleRandom(seeds, stream=4).uniform((100,)), uniform)  # another stream


def test_training_samples_are_augmented_the_same_for_any_number_of_processes(synth):
    """Rank 1 of 2 gets the second half of each global batch, augmented exactly as one process would."""
    codec = CTCCodec(ALPHABET, fold_case=True)
    transform = ImageTransform(Preprocessing(32, 100))
    strong = DeviceTransform(transform, Augmentation.from_config("strong", {}))
    samples = SeededSamples([LmdbDataset(synth / "train", codec, 26, transform)])
    collate = CollateBatch(codec, transform.output_shape, torch.uint8)

    def batches(rank: int, world_size: int) -> list[torch.Tensor]:
        sampler = GlobalBatchSampler([len(samples)], 8, rank, world_size, seed=0)
        sampler.set_steps(3, 5)
        collated = (collate([samples[item] for item in batch]) for batch in sampler)
        return [strong(batch.images, batch.widths, batch.seeds) for batch in collated]

    whole, second_half = batches(0, 1), batches(1, 2)
    for full, half in zip(whole, second_half):
        assert torch.equal(full[4:], half)
    dataset = LmdbDataset(synth / "train", codec, 26, transform)
    sampler = GlobalBatchSampler([len(samples)], 8, 0, 1, seed=0)
    sampler.set_steps(3, 4)
    [batch] = list(sampler)
    assert not torch.equal(whole[0], torch.stack([dataset[index][0] for index, _ in batch]))


@pytest.fixture(scope="module")
def strongly_augmented(tiny_run, tmp_path_factory):
    """tiny_run's best.pt, its config saying it trained with strong augmentation and every probability 1."""
    checkpoint = load_checkpoint(tiny_run / "best.pt")
    checkpoint["config"]["data"]["augment"] = "strong"
    checkpoint["config"]["augment"] = {name: 1.0 for name in PROBABILITIES["strong"]}
    path = tmp_path_factory.mktemp("augmented") / "best.pt"
    save_checkpoint(path, checkpoint)
    return path


@pytest.mark.slow
def test_prediction_and_evaluation_never_augment(strongly_augmented, synth, tmp_path):
    samples = read_lmdb(synth / "val")[:5]
    paths = write_images(synth, tmp_path, 5)
    model, codec, _, preprocessing = load_model(strongly_augmented)
    with torch.inference_mode():
        expected = codec.decode(model(torch.stack([ImageTransform(preprocessing)(image) for image, _ in samples])))
    result = subprocess.run(
        [sys.executable, "scripts/predict.py", str(strongly_augmented), *map(str, paths), "--precision", "fp32"],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    read = [line.split("\t") for line in result.stdout.splitlines()]
    assert [float(confidence) for _, _, confidence, _ in read] == pytest.approx(
        [r.confidence for r in expected], abs=1.5e-4
    )

    dumps = {}
    for name, checkpoint in (("augmented", strongly_augmented), ("plain", strongly_augmented.parent / "plain.pt")):
        if name == "plain":
            plain = load_checkpoint(strongly_augmented)
            plain["config"]["data"]["augment"] = "none"
            save_checkpoint(checkpoint, plain)
        dumps[name] = tmp_path / f"{name}.tsv"
        evaluated = subprocess.run(
            [
                "bash",
                "scripts/eval.sh",
                str(checkpoint),
                str(synth / "val"),
                "--dump",
                str(dumps[name]),
                "--precision",
                "fp32",
            ],
            cwd=REPO,
            env={**run_env(), "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert evaluated.returncode == 0, evaluated.stderr
    assert dumps["augmented"].read_text() == dumps["plain"].read_text()
