"""timm CaiT (issue 31) run live by timm's own code, exact against timm's own tensors: the self-attention layers'
weights as talking heads apply them to the values (after proj_w mixes the heads' probabilities, said), and the
class-attention layers' CLS row over [CLS, patches] on the same T x T grid (the CLS token joins there; said). A
bare file is refused by name with the route, and the route (--code) opens it; a timm hub folder opens by timm's own
code, built from its config.json."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb, recorded_forward
from vitviz.core.analyses import analysis
from vitviz.core.running.live import LiveWarning
from vitviz.errors import UnknownLayoutError

timm = pytest.importorskip("timm")

ATOL = 1e-5
ARGS = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, depth_token_only=2, num_classes=5)
N = 16   # 4 x 4 patches


def cait(fused: bool = True):
    model = perturb(timm.create_model("cait_xxs24_224", pretrained=False, **ARGS))
    for blk in model.blocks_token_only:
        blk.attn.fused_attn = fused
    return model


def timm_weights(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's output and, per block in order, the weights timm multiplies the values with, read where timm applies
    them (the input of `attn_drop`, an identity in eval mode, just before `attn @ v`): (B, H, N, N) after proj_w in
    the talking-heads blocks, (B, H, 1, N + 1) in the class-attention blocks (their fused SDPA switched off)."""
    fused = [blk.attn.fused_attn for blk in model.blocks_token_only]
    for blk in model.blocks_token_only:
        blk.attn.fused_attn = False
    try:
        return recorded_forward(model, x, [blk.attn.attn_drop for blk in [*model.blocks, *model.blocks_token_only]],
                                before=True)
    finally:
        for blk, f in zip(model.blocks_token_only, fused):
            blk.attn.fused_attn = f


def on_grid(maps: list[torch.Tensor], image: int) -> np.ndarray:
    """timm's per-block weights of one image laid on the (N + 1) x (N + 1) grid, the CLS token first."""
    full = np.zeros((len(maps), ARGS["num_heads"], N + 1, N + 1), np.float32)
    for i, m in enumerate(maps):
        m = m[image].numpy()
        if m.shape[-2] == 1:
            full[i, :, :1, :] = m
        else:
            full[i, :, 1:, 1:] = m
    return full


def load_quietly(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiveWarning)
        return vitviz.load(model, device="cpu", **kw)


@pytest.mark.parametrize("fused", [True, False], ids=["sdpa", "softmax"])
def test_cait_live_is_exact_against_timms_own_weights(fused: bool) -> None:
    model = cait(fused)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vm = vitviz.load(model, device="cpu")
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, LiveWarning))
    assert "blocks.0.attn.proj_w" in said and "weights applied to the values" in said and "class-attention" in said
    assert [name for name, _ in vm.layers] == ["blocks.0.attn", "blocks.1.attn", "blocks_token_only.0.attn",
                                               "blocks_token_only.1.attn"]
    assert vm.skipped == []
    assert (vm.spec.num_prefix, vm.spec.grid, vm.spec.prefix_names) == (1, (4, 4), ("cls",))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, maps = timm_weights(model, x)
    attn, logits = vm.forward_captured(x)
    assert attn.shape == (2, 4, 4, N + 1, N + 1)
    for b in range(2):
        np.testing.assert_allclose(attn[b], on_grid(maps, b), atol=ATOL, err_msg=f"image {b}")
    np.testing.assert_allclose(logits, out.numpy(), atol=ATOL)
    # the weights talking heads apply are no softmax: shown as they are, not re-normalised
    assert not np.allclose(attn[:, 0, :, 1:, 1:].sum(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(attn[:, 2:, :, 0].sum(-1), 1.0, atol=1e-5)
    # the CLS map is the last class-attention layer's CLS row over the patches
    r = vm.run(x[:1])
    cls = analysis.cls_attention(r, layer=-1, head="mean")
    np.testing.assert_allclose(cls, maps[-1][0, :, 0, 1:].mean(0).reshape(4, 4).numpy(), atol=ATOL)


def test_cait_live_stops_early_and_keeps_rows() -> None:
    model = cait()
    vm = load_quietly(model)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    _out, maps = timm_weights(model, x)
    full = on_grid(maps, 0)
    early, _ = vm.forward_captured(x, logits=False, upto=1)
    np.testing.assert_allclose(early[0], full[:2], atol=ATOL)
    rows, _ = vm.forward_captured(x, rows=[0, 5])
    np.testing.assert_allclose(rows[0], full[:, :, [0, 5]], atol=ATOL)


@pytest.mark.parametrize("route", ["live", "hub folder"])
def test_cait_verify_compares_what_is_shown_with_timms_own_record(tmp_path, route: str) -> None:
    """verify of CaiT run by timm's code: each layer vitviz shows against timm's own weights of the same model (read
    at attn_drop, fused attention off; a fresh build from the folder, or a copy of the live module sharing its
    weights), laid on the T x T grid -- verified, with the maxima; a shown map changed (heads swapped) differs."""
    model = cait()
    if route == "live":
        vm = load_quietly(model)
    else:
        timm.models._hub.save_for_hf(model, str(tmp_path), model_args=ARGS, safe_serialization=True)
        vm = load_quietly(tmp_path)
    check = vitviz.verify(vm)
    assert check.verdict == "verified" and check.library == "timm", check.reason
    assert [len(layers) for layers in check.per_layer] == [4] and check.max_attention <= 1e-6
    assert check.max_output <= 1e-5 and check.sizes == ((32, 32),) and "built for" in check.one_size
    assert ("config.json" in check.original) == (route == "hub folder")
    assert all(blk.attn.fused_attn for blk in model.blocks_token_only)      # the user's object left as it was
    shown = vm.forward_streamed
    vm.forward_streamed = lambda x, each: shown(x, lambda layer: each(layer.flip(1)))   # heads in another order
    wrong = vitviz.verify(vm)
    assert wrong.verdict == "differs" and wrong.first_differing_layer == 0 and wrong.max_attention > 1e-4


@pytest.mark.parametrize("name", ["cait_xxs24_224.pth", "model.pth"])
def test_cait_file_is_refused_by_name_with_the_route(tmp_path, name: str) -> None:
    path = tmp_path / name
    torch.save(cait().state_dict(), path)
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(path, device="cpu")
    msg = str(e.value)
    assert "timm CaiT" in msg and "talking heads" in msg and "class-attention" in msg
    assert "vitviz.load(timm.create_model(" in msg and "--code FILE.py:FACTORY" in msg


def test_cait_file_opens_with_its_code(tmp_path) -> None:
    """The route the refusal names for the command line: --code FILE.py:FACTORY with the file's weights."""
    model = cait()
    path = tmp_path / "cait_xxs24_224.pth"
    torch.save(model.state_dict(), path)
    code = tmp_path / "make_cait.py"
    code.write_text("import timm\n\n\ndef make():\n"
                    f"    return timm.create_model('cait_xxs24_224', pretrained=False, **{ARGS!r})\n")
    vm = load_quietly(path, code=f"{code}:make")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    out, maps = timm_weights(model, x)
    r = vm.run(x)
    np.testing.assert_allclose(r.attentions, on_grid(maps, 0), atol=ATOL)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


def test_cait_hub_folder_opens_by_timm_code(tmp_path) -> None:
    """A timm hub folder of CaiT (config.json naming the architecture and its model_args): vitviz does not convert
    its layout, so timm's own code is built from the folder's config, given the file's tensors strictly, and run
    live -- the weights timm applies and its logits, exactly. A folder whose tensors do not fit stays refused."""
    model = cait()
    timm.models._hub.save_for_hf(model, str(tmp_path / "hub"), model_args=ARGS, safe_serialization=True)
    vm = load_quietly(tmp_path / "hub")
    assert "by its code" in vm.spec.source_of("path") and "cait_xxs24_224" in vm.spec.source_of("identity")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    out, maps = timm_weights(model, x)
    r = vm.run(x)
    np.testing.assert_allclose(r.attentions, on_grid(maps, 0), atol=ATOL)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)
    other = dict(ARGS, embed_dim=32)      # a config that does not fit the file's tensors: refused by name
    timm.models._hub.save_for_hf(model, str(tmp_path / "bad"), model_args=other, safe_serialization=True)
    with pytest.raises(UnknownLayoutError, match="cait_xxs24_224"):
        vitviz.load(tmp_path / "bad", device="cpu")
