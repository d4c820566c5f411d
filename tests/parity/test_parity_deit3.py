"""Parity for DeiT III (timm `deit3_*`: `no_embed_class`, layer scale) saved as a timm hub folder and as the
original `{'model': ...}` file with `gamma_1` / `gamma_2`, at the native and another resolution."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from parity_towers import timm_pool_reference
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")

ARGS = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)


@pytest.mark.parametrize("save", ["hub", "original"])
def test_deit3(tmp_path, save: str) -> None:
    model = perturb(timm.create_model("deit3_small_patch16_224", pretrained=False, num_classes=5,
                                      dynamic_img_size=True, **ARGS))
    if save == "hub":
        timm.models._hub.save_for_hf(model, str(tmp_path), model_args=ARGS)
        path = tmp_path
    else:
        sd = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in model.state_dict().items()}
        path = tmp_path / "deit_3_small_224_1k.pth"
        torch.save({"model": sd}, path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning)
        vm = vitviz.load(path, device="cpu", heads=4)
    assert vm.spec.pos_interp == ("timm" if save == "hub" else "deit")
    assert vm.spec.layer_scale and vm.spec.pos_prefix == 0 and vm.spec.rope == "" and vm.spec.position_kind == "learned"
    # at another size a {'model': ...} file is DeiT III's own (bicubic, no antialias, as facebookresearch/deit
    # fine-tunes), a timm hub folder timm's (antialias): only the hub folder is compared with timm there
    for size in [(32, 32), (40, 56)] if save == "hub" else [(32, 32)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
        out, maps, _ = timm_pool_reference(model, x)
        r = vm.run(x)
        np.testing.assert_allclose(r.logits, out[0].numpy(), atol=1e-5)
        for i, ref in enumerate(maps):
            np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=1e-5)
