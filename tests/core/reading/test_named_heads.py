"""The head count a model's name fixes: timm's registered count per architecture, a size word only at its width.

No tensor holds the head count. A timm hub folder names its architecture, and before this the name's size word
alone set the count: timm's DINOv2 giant (1536 wide, 24 heads) opened with ViT-g/14's 16, and verify found it
(bench/scale.py --giant). Each case here is built by timm (one block, small images) and opened as a hub folder.
"""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.core.reading.metadata import named_heads
from vitviz.core.reading.timm_heads import TIMM_HEADS, TIMM_VERSION

timm = pytest.importorskip("timm")
ROOT = Path(__file__).resolve().parents[3]


def _hub_folder(arch: str, folder: Path, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    net = timm.create_model(arch, pretrained=False, depth=1, img_size=size).eval()
    timm.models._hub.save_for_hf(net, str(folder), safe_serialization=True,
                                 model_args={"depth": 1, "img_size": size})
    return net


@pytest.mark.parametrize("arch, size", [
    ("vit_giant_patch14_dinov2", 28),          # 1536 wide: 24 heads, not ViT-g/14's 16
    ("vit_huge_plus_patch16_dinov3", 32),      # 1280 wide: 20 heads, not huge's 16
    ("vit_base_patch16_reg4_gap_256", 32),     # 768 wide, '_gap_': 12 heads
    ("vit_base_patch16_gap_224", 32),          # as wide, also '_gap_': 16 heads
    ("vit_giant_patch14_clip_224", 28),        # ViT-g/14 itself: 1408 wide, 16 heads
])
def test_a_timm_folder_opens_with_the_heads_timm_registers(tmp_path: Path, arch: str, size: int) -> None:
    net = _hub_folder(arch, tmp_path / arch, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(tmp_path / arch)
    assert model.spec.num_heads == net.blocks[0].attn.num_heads
    assert model.spec.source_of("num_heads").startswith(f"named model: timm {TIMM_VERSION} registers '{arch}'")


def test_the_giant_dinov2_folder_is_verified_against_timm(tmp_path: Path) -> None:
    """The case the bench caught, through verify: with 16 heads it differs from layer 0."""
    from vitviz.core.analyses.verify import verify

    _hub_folder("vit_giant_patch14_dinov2", tmp_path / "g", 28)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(tmp_path / "g")
        check = verify(model, sizes=[28])
    assert check.verified, check.summary()


def test_a_size_word_fixes_heads_only_at_its_own_width() -> None:
    assert named_heads("my_vit_giant_run3", 1408) == (16, "metadata: model name 'my_vit_giant_run3'")
    assert named_heads("my_vit_giant_run3", 1536) is None        # giant at another width: the name fixes nothing
    assert named_heads("dinov2_vitg14", 1536) == (24, "metadata: model name 'dinov2_vitg14'")
    assert named_heads("vit_small_custom", 384)[0] == 6
    assert named_heads("vit_small_custom", 512) is None
    # a registered architecture at a width other than its own (model_args changed it): timm keeps the count
    assert named_heads("vit_giant_patch14_dinov2", 1032)[0] == 24
    assert "the width here is 1032 (1536 registered)" in named_heads("vit_giant_patch14_dinov2", 1032)[1]
    assert named_heads("vit_h_14", 1280) == (16, "named model: torchvision builds 'vit_h_14' with 16 heads (1280 wide)")
    assert named_heads("vit_giant_patch14_dinov2", 1000) is None      # 24 heads do not divide it
    assert named_heads("vit_giant_patch14_dinov2.lvd142m", 1536)[0] == 24


def test_the_table_is_what_the_installed_timm_registers() -> None:
    """A sample of the generated table against timm itself (built on the meta device); after a timm upgrade,
    regenerate it with scripts/timm_heads_table.py."""
    if timm.__version__ != TIMM_VERSION:
        pytest.skip(f"table generated from timm {TIMM_VERSION}, timm {timm.__version__} installed")
    spec = importlib.util.spec_from_file_location("timm_heads_table", ROOT / "scripts" / "timm_heads_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    names = sorted(TIMM_HEADS)
    sample = names[:: max(1, len(names) // 12)] + ["vit_giant_patch14_dinov2", "vit_huge_plus_patch16_dinov3"]
    for name in sample:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = timm.create_model(name, pretrained=False)
        assert script.heads_of(net) == TIMM_HEADS[name], name
