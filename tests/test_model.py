from __future__ import annotations

import ast

import pytest
import torch

from models import build_model, count_parameters, output_frames
from tests.conftest import REPO


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("crnn", num_classes=37, in_channels=1, hidden_size=256)


@pytest.mark.parametrize("width, frames", [(100, 26), (64, 17), (160, 41), (256, 65)])
def test_output_is_batch_first(model, width, frames):
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(3, 1, 32, width))
    assert logits.shape == (3, frames, 37)
    assert output_frames(model, 1, 32, width) == frames


def test_parameter_count_matches_the_paper_model(model):
    assert 8.2e6 < count_parameters(model) < 8.4e6


def test_chunks_concatenated_on_dim0_equal_the_whole_batch(model):
    """What DataParallel/DDP do at the boundary: split on dim 0, run, concatenate on dim 0."""
    model.eval()
    images = torch.randn(6, 1, 32, 100)
    with torch.no_grad():
        whole = model(images)
        chunks = torch.cat([model(images[:4]), model(images[4:])], dim=0)
    torch.testing.assert_close(chunks, whole, rtol=1e-4, atol=1e-5)


def test_every_parameter_gets_a_gradient(model):
    """DDP runs with find_unused_parameters=False: a parameter unused in forward would hang it."""
    model.train()
    model.zero_grad(set_to_none=True)
    model(torch.randn(2, 1, 32, 100)).logsumexp(-1).sum().backward()
    unused = [name for name, p in model.named_parameters() if p.grad is None]
    assert unused == []


def test_rgb_input_and_wrong_height():
    rgb = build_model("crnn", num_classes=11, in_channels=3, hidden_size=64).eval()
    assert rgb(torch.randn(1, 3, 32, 100)).shape == (1, 26, 11)
    with pytest.raises(ValueError, match="32 pixels high"):
        rgb(torch.randn(1, 3, 64, 100))


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="model.arch"):
        build_model("resnet", 10, 1, 256)


def test_channels_set_the_backbone_widths_and_a_wrong_count_is_named():
    narrow = build_model("crnn", 37, 1, 256, channels=(32, 64, 128, 128, 256, 256, 256))
    assert narrow(torch.randn(2, 1, 32, 100)).shape == (2, 26, 37)
    convolutions = [layer.out_channels for layer in narrow.modules() if isinstance(layer, torch.nn.Conv2d)]
    assert convolutions == [32, 64, 128, 128, 256, 256, 256]
    assert count_parameters(narrow) < count_parameters(build_model("crnn", 37, 1, 256)) / 2
    with pytest.raises(ValueError, match=r"model.channels: the VGG backbone has 7 convolutions, got 6 widths"):
        build_model("crnn", 37, 1, 256, channels=(32, 64, 128, 128, 256, 256))


def test_lstm_layers_sets_how_many_bilstms_read_the_frames():
    images = torch.randn(2, 1, 32, 100)
    for layers in (1, 3):
        model = build_model("crnn", 37, 1, 64, lstm_layers=layers)
        assert sum(isinstance(module, torch.nn.LSTM) for module in model.modules()) == layers
        assert model(images).shape == (2, 26, 37)
        # The last BiLSTM's projection is the classifier; the ones before it project to hidden_size.
        assert [module.out_features for module in model.modules() if isinstance(module, torch.nn.Linear)] == [64] * (
            layers - 1
        ) + [37]
    with pytest.raises(ValueError, match=r"model.lstm_layers=-1: must be at least 0"):
        build_model("crnn", 37, 1, 64, lstm_layers=-1)


def test_no_lstm_classifies_each_frame_from_the_backbone_alone():
    """lstm_layers=0: every frame's classes from its own column of backbone features (Rosetta's CNN + CTC),
    so changing the image far to the left of a frame's receptive field leaves that frame's logits alone."""
    model = build_model("crnn", 37, 1, 64, channels=(4, 4, 8, 8, 8, 8, 16), lstm_layers=0).eval()
    assert not any(isinstance(module, torch.nn.LSTM) for module in model.modules())
    assert [(layer.in_features, layer.out_features) for layer in model.sequence] == [(16, 37)]
    images = torch.randn(1, 1, 32, 256)
    changed = images.clone()
    changed[..., :16] = 0.0
    with torch.no_grad():
        logits, logits_changed = model(images), model(changed)
    assert logits.shape == (1, 65, 37)
    assert torch.equal(logits[:, -20:], logits_changed[:, -20:])
    assert not torch.equal(logits[:, :2], logits_changed[:, :2])
    # With a BiLSTM, every frame reads the whole line.
    with torch.no_grad():
        recurrent = build_model("crnn", 37, 1, 64, channels=(4, 4, 8, 8, 8, 8, 16), lstm_layers=1).eval()
        assert not torch.equal(recurrent(images)[:, -20:], recurrent(changed)[:, -20:])


def test_cnn_shortcut_adds_each_frames_own_classes_to_the_bilstms():
    """model.cnn_shortcut: a classifier of each frame's own column of backbone features, added to the BiLSTM's
    output. Off, the model and its state dict keys are the ones older checkpoints hold."""
    channels = (4, 4, 8, 8, 8, 8, 16)
    torch.manual_seed(0)
    plain = build_model("crnn", 37, 1, 64, channels=channels, lstm_layers=1).eval()
    torch.manual_seed(0)
    model = build_model("crnn", 37, 1, 64, channels=channels, lstm_layers=1, cnn_shortcut=True).eval()
    assert set(model.state_dict()) - set(plain.state_dict()) == {"shortcut.weight", "shortcut.bias"}
    assert (model.shortcut.in_features, model.shortcut.out_features) == (16, 37)
    images = torch.randn(1, 1, 32, 256)
    changed = images.clone()
    changed[..., :16] = 0.0
    with torch.no_grad():
        shortcut_logits = model.shortcut(model.backbone(images).squeeze(2).transpose(1, 2))
        torch.testing.assert_close(model(images), plain(images) + shortcut_logits)
        # With the BiLSTM's projection at zero, what is left is the shortcut: each frame reads its own
        # column, so a change far to the left of the last frames leaves their logits alone.
        model.sequence[-1].linear.weight.zero_()
        model.sequence[-1].linear.bias.zero_()
        assert torch.equal(model(images)[:, -20:], model(changed)[:, -20:])
        assert not torch.equal(model(images)[:, :2], model(changed)[:, :2])
    model.train()
    model(torch.randn(2, 1, 32, 100)).logsumexp(-1).sum().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    with pytest.raises(ValueError, match=r"model.cnn_shortcut=true .* model.lstm_layers=0 has no BiLSTM"):
        build_model("crnn", 37, 1, 64, lstm_layers=0, cnn_shortcut=True)
    with pytest.raises(ValueError, match=r"model.cnn_shortcut='yes': must be true or false"):
        build_model("crnn", 37, 1, 64, cnn_shortcut="yes")


def test_pool_before_norm_and_strided_stem_reorder_the_backbone_not_its_frames():
    """model.pool_before_norm: each max-pool straight after its convolution, so BatchNorm and ReLU run on the
    pooled maps; model.strided_stem: the first convolution strides 2 where the first pooling was. Neither
    changes the frames a width gives; pooling before an eval-mode BatchNorm of positive scale and a ReLU
    gives what pooling after them gives (all three are monotone per channel)."""
    channels = (4, 4, 8, 8, 8, 8, 16)
    torch.manual_seed(0)
    paper = build_model("crnn", 37, 1, 64, channels=channels, lstm_layers=1).eval()
    layouts = {}
    for pool_before_norm in (False, True):
        for strided_stem in (False, True):
            layouts[pool_before_norm, strided_stem] = build_model(
                "crnn",
                37,
                1,
                64,
                channels=channels,
                lstm_layers=1,
                pool_before_norm=pool_before_norm,
                strided_stem=strided_stem,
            ).eval()
    for (pool_before_norm, strided_stem), model in layouts.items():
        layers = list(model.backbone)
        before_pools = [type(layers[i - 1]) for i, layer in enumerate(layers) if isinstance(layer, torch.nn.MaxPool2d)]
        assert before_pools == [torch.nn.Conv2d if pool_before_norm else torch.nn.ReLU] * (3 if strided_stem else 4)
        assert layers[0].stride == ((2, 2) if strided_stem else (1, 1))
        for width, frames in [(100, 26), (128, 33), (256, 65)]:
            assert output_frames(model, 1, 32, width) == frames
        model.train()
        model.zero_grad(set_to_none=True)
        model(torch.randn(2, 1, 32, 100)).logsumexp(-1).sum().backward()
        assert [name for name, p in model.named_parameters() if p.grad is None] == []
        model.eval()
    # The same weights, module for module, in the pool-first layout: the same logits.
    pool_first = layouts[True, False]
    with torch.no_grad():
        for module in paper.backbone:
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.running_mean.normal_()
        paper_weights = [m for m in paper.backbone if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d))]
        pool_first_weights = [m for m in pool_first.backbone if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d))]
        for source, target in zip(paper_weights, pool_first_weights, strict=True):
            target.load_state_dict(source.state_dict())
        pool_first.sequence.load_state_dict(paper.sequence.state_dict())
        images = torch.randn(2, 1, 32, 128)
        torch.testing.assert_close(pool_first(images), paper(images))
    assert set(pool_first.state_dict()) != set(paper.state_dict())  # a checkpoint fits its own layout only
    with pytest.raises(ValueError, match=r"model.pool_before_norm='yes': must be true or false"):
        build_model("crnn", 37, 1, 64, pool_before_norm="yes")
    with pytest.raises(ValueError, match=r"model.strided_stem=1: must be true or false"):
        build_model("crnn", 37, 1, 64, strided_stem=1)


def test_only_models_init_imports_the_crnn_so_a_fork_can_delete_it():
    """models/__init__.py's promise: dropping models/crnn.py is its one import line there, plus model.arch's
    default; what other architectures and the weight importer share with it lives in models/layers.py."""
    importers = set()
    for path in REPO.rglob("*.py"):
        if any(part.startswith(".") for part in path.relative_to(REPO).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            if any(name == "models.crnn" or name.startswith("models.crnn.") for name in names):
                importers.add(path.relative_to(REPO).as_posix())
    assert importers == {"models/__init__.py"}
