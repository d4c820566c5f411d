"""mmpretrain's VisionTransformer layout, a family added as one file (`vitviz/core/reading/families/mmpretrain.py`): a timm
ViT saved under mmpretrain's key names, as an mmpretrain training checkpoint (`meta` + `state_dict`), opens as
family 'mmpretrain' with its classifier and gives timm's logits and attention exactly."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb, timm_reference

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TO_MM = [(r"^patch_embed\.proj\.", "backbone.patch_embed.projection."), (r"^norm\.", "backbone.ln1."),
         (r"^cls_token$", "backbone.cls_token"), (r"^pos_embed$", "backbone.pos_embed"),
         (r"^blocks\.(\d+)\.norm1\.", r"backbone.layers.\1.ln1."), (r"^blocks\.(\d+)\.norm2\.", r"backbone.layers.\1.ln2."),
         (r"^blocks\.(\d+)\.attn\.", r"backbone.layers.\1.attn."),
         (r"^blocks\.(\d+)\.mlp\.fc1\.", r"backbone.layers.\1.ffn.layers.0.0."),
         (r"^blocks\.(\d+)\.mlp\.fc2\.", r"backbone.layers.\1.ffn.layers.1."), (r"^head\.", "head.layers.head.")]


def _mm_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        for pattern, repl in TO_MM:
            key = re.sub(pattern, repl, key)
        assert key.startswith(("backbone.", "head.layers.")), key
        out[key] = value
    return out


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("size", [(32, 32), (48, 40)])
def test_mmpretrain_checkpoint_matches_timm(tmp_path, size: tuple[int, int]) -> None:
    """At the native size and another (the position table resampled bicubic without antialias, as mmpretrain's
    resize_pos_embed and timm's resampling agree when upsampling)."""
    model = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=2, num_heads=3, mlp_ratio=2.0,
                                      num_classes=4, dynamic_img_size=True))
    path = tmp_path / "epoch_12.pth"
    torch.save({"meta": {"epoch": 12, "mmpretrain_version": "1.2.0"}, "state_dict": _mm_keys(model.state_dict()),
                "optimizer": {}}, path)
    vm = vitviz.load(path, heads=3, device="cpu")
    assert vm.spec.family == "mmpretrain" and vm.spec.num_classes == 4 and vm.spec.eps == 1e-6
    assert vm.spec.kind_of("eps") == "assumed"            # a default of the family, said: nothing names the model
    assert vm.spec.num_params == sum(p.numel() for p in model.parameters())
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    ref = model
    if size != (32, 32):   # mmpretrain's resize_pos_embed: bicubic, align_corners=False, no antialias
        ref = VisionTransformer(img_size=size, patch_size=8, embed_dim=96, depth=2, num_heads=3, mlp_ratio=2.0,
                                num_classes=4).eval()
        sd = dict(model.state_dict())
        grid = sd["pos_embed"][:, 1:].reshape(1, 4, 4, 96).permute(0, 3, 1, 2)
        grid = torch.nn.functional.interpolate(grid, size=(size[0] // 8, size[1] // 8), mode="bicubic",
                                               align_corners=False)
        sd["pos_embed"] = torch.cat([sd["pos_embed"][:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
        ref.load_state_dict(sd)
    out, maps = timm_reference(ref, x)
    result = vm.run(x)
    assert result.spec.grid == (size[0] // 8, size[1] // 8)
    for i, ref_map in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref_map[0].numpy(), atol=1e-5, err_msg=f"layer {i}")
    np.testing.assert_allclose(result.logits, out[0].numpy(), atol=1e-5)


def test_the_family_is_registered_by_its_file_alone() -> None:
    """Nothing but its module lists it: the registry finds it, its facts are read, names guess it."""
    from vitviz.core.reading import families
    recipe = families.recipe("mmpretrain")    # its ViT configs: mean = std = 127.5, the whole short side at 384
    assert "mmpretrain" in families.FAMILY_NAMES and recipe.mean == recipe.std == (0.5, 0.5, 0.5)
    assert recipe.crop_pct == 1.0 and recipe.interpolation == "bilinear" and recipe.mode == "center"
    assert families.family_from_name("vit-base-p16_in1k-384px_20220308-ab8a5b4e.pth") == "mmpretrain"
    orders = [m.DETECT_ORDER for m in families.FAMILIES]
    assert orders == sorted(orders) and families.FAMILIES[-1].NAMES == ("structural",)
