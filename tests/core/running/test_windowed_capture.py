"""The windowed capture's fast path (vitviz.core.running.windowed): the attention built in place (bias, SAM's decomposed
bias in slices, the shift mask, the softmax written over its input) gives bitwise the values of the out-of-place
sums that run whenever a gradient is needed; the one-key-per-row NaN check still catches non-finite attention; a
Swin input smaller than one patch is refused, never run (issue 34)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from _windowed import swin_spec, sam_spec
import vitviz
from parity_refs import perturb
from vitviz.core.running import windowed
from vitviz.core.running.windowed import WindowedModel, WindowedNet
from vitviz.errors import NonFiniteError, VitvizError






SPECS = {
    "swin": swin_spec(),
    "swin roll_pad": replace(swin_spec(), order="roll_pad", shift_rule="built"),
    "swinv2": replace(swin_spec(), attn_kind="cosine", rel_pos="cpb", block_norm="res_post", merge_norm="after"),
    "sam": sam_spec(),
}


def probed(net: WindowedNet, x: torch.Tensor) -> tuple[list[torch.Tensor], bool]:
    """Every block's softmax, and whether all of them were made on the autograd path."""
    kept: list[torch.Tensor] = []
    grads: list[bool] = []

    def hook(_m, _i, out: torch.Tensor) -> None:
        kept.append(out.detach().clone())
        grads.append(out.requires_grad)

    hooks = [blk.attn.probe.register_forward_hook(hook) for blk in net.all_blocks()]
    try:
        net(x)
    finally:
        for h in hooks:
            h.remove()
    return kept, all(grads)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("chunk", [windowed.CHUNK, 40])
def test_in_place_is_bitwise_the_out_of_place_path(name: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """chunk=40: SAM's decomposed bias made a few rows at a time (every slice boundary exercised)."""
    monkeypatch.setattr(windowed, "CHUNK", chunk)
    spec = SPECS[name]
    torch.manual_seed(0)
    net = perturb(WindowedNet(spec), std=0.3)
    size = (72, 60) if spec.arch == "sam" else (80, 68)      # padded windows, resampled tables
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fast = probed(net, x)
        out_fast = net(x)
    with torch.enable_grad():                                  # parameters need gradients: the out-of-place sums
        slow = probed(net, x)
        out_slow = net(x)
    (fast, fast_grad), (slow, slow_grad) = fast, slow
    assert slow_grad and not fast_grad and len(fast) == spec.depth
    for i, (a, b) in enumerate(zip(fast, slow)):
        assert torch.equal(a, b.detach()), f"block {i}"
    assert torch.equal(out_fast, out_slow.detach())


def test_non_finite_attention_is_refused() -> None:
    spec = swin_spec()
    torch.manual_seed(0)
    net = perturb(WindowedNet(spec), std=0.3)
    with torch.no_grad():
        net.all_blocks()[2].attn.qkv.weight[0, 0] = float("nan")
    model = WindowedModel(net, spec, torch.device("cpu"), [])
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(NonFiniteError, match=r"block 2 \(windowed \(4×4\)\)"):
        model.run(x)
    with torch.no_grad():
        net.all_blocks()[2].attn.qkv.weight[0, 0] = 0.0
        net.all_blocks()[3].attn.qkv.weight[5, 3] = float("inf")    # an infinite logit: its row's sum is NaN
    with pytest.raises(NonFiniteError, match="block 3"):
        model.run(x)
    with torch.no_grad():
        net.all_blocks()[3].attn.qkv.weight[5, 3] = 0.0
    assert np.isfinite(model.run(x).blocks[3]).all()


def test_what_a_panel_reads_of_a_windowed_model_the_model_answers() -> None:
    """Parameters per part (patch mergings and stages' blocks) and the blocks a forward can be stopped before come
    from the model itself, as a plain model's do: no caller asks which lane it holds."""
    from _windowed import model_of

    for spec in (swin_spec(), sam_spec()):
        model = model_of(spec)
        counts = model.parameter_counts()
        assert sum(counts.values()) == sum(p.numel() for p in model.net.parameters())
        assert all(counts.values()) and "other" not in counts
        assert model.hook_points() == model.net.all_blocks() and len(model.hook_points()) == spec.depth
    assert "patch merging" in model_of(swin_spec()).parameter_counts()
    assert "neck" in model_of(sam_spec()).parameter_counts()


def test_a_windowed_result_names_its_top_classes_as_a_plain_one_does() -> None:
    from _windowed import model_of, x_for

    r = model_of(swin_spec()).run(x_for((64, 64)))
    top = r.top_k(2)
    p = np.exp(r.logits - r.logits.max())
    p /= p.sum()
    assert [i for i, _, _ in top] == list(np.argsort(-p)[:2]) and top[0][1] == f"class {top[0][0]}"
    assert abs(top[0][2] - p.max()) < 1e-6


# ------------------------------------------------------------------------- a Swin input smaller than a patch (issue 34)

@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_swin_input_smaller_than_one_patch_is_refused(size: int, tiny_swin_folder: Path, tmp_path: Path) -> None:
    from vitviz.errors import InconsistentCheckpointError, OverrideError

    image = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(OverrideError, match="smaller than one 4 px patch"):
        vitviz.load(tiny_swin_folder, image_size=size)
    with pytest.raises(VitvizError, match="smaller than one patch"):
        vitviz.load(tiny_swin_folder).run(image, image_size=size)
    if size != 2:      # img_size 1 or 3 in its config
        import shutil

        folder = tmp_path / "swin"
        shutil.copytree(tiny_swin_folder, folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg.setdefault("model_args", {})["img_size"] = size
        cfg.setdefault("pretrained_cfg", {})["input_size"] = [3, size, size]
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(InconsistentCheckpointError, match=f"image size {size}x{size} .*config.json"):
            vitviz.load(folder)
    assert vitviz.load(tiny_swin_folder).run(image, image_size=4).spec.image_size == (4, 4)   # one patch runs
