"""timm CaiT (issue 31): refused by file, by name, with why (talking heads, class-attention layers) and the route;
the route works: timm's own code run live shows the self-attention layers' softmax exactly (before the talking
heads' proj_w mixes it, which is said) and lists the class-attention layers as not shown, never silently."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.running.live import LiveWarning
from vitviz.errors import UnknownLayoutError

timm = pytest.importorskip("timm")

ATOL = 1e-5
ARGS = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, depth_token_only=2, num_classes=5)


def cait():
    return perturb(timm.create_model("cait_xxs24_224", pretrained=False, **ARGS))


def talking_heads_softmax(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's output, and each self-attention block's softmax (B, H, N, N), recomputed from the input its
    TalkingHeadAttn receives: (q * scale) @ k^T, mixed across heads by proj_l, softmax (proj_w comes after)."""
    inputs: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    maps = []
    with torch.no_grad():
        for blk, t in zip(model.blocks, inputs):
            a = blk.attn
            b, n, c = t.shape
            q, k, _ = a.qkv(t).reshape(b, n, 3, a.num_heads, c // a.num_heads).permute(2, 0, 3, 1, 4)
            s = (q * a.scale) @ k.transpose(-2, -1)
            s = a.proj_l(s.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            maps.append(s.softmax(dim=-1))
    return out, maps


@pytest.mark.parametrize("name", ["cait_xxs24_224.pth", "model.pth"])
def test_cait_file_is_refused_by_name_with_the_route(tmp_path, name: str) -> None:
    path = tmp_path / name
    torch.save(cait().state_dict(), path)
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(path, device="cpu")
    msg = str(e.value)
    assert "timm CaiT" in msg and "talking heads" in msg and "class-attention" in msg
    assert "vitviz.load(timm.create_model(" in msg and "--code FILE.py:FACTORY" in msg


def test_cait_live_shows_the_self_attention_softmax_and_says_what_it_does_not_show() -> None:
    model = cait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vm = vitviz.load(model, device="cpu")
    said = [str(w.message) for w in caught if issubclass(w.category, LiveWarning)]
    assert any("blocks.0.attn" in m and "talking heads" in m for m in said), said
    assert [name for name, _ in vm.layers] == ["blocks.0.attn", "blocks.1.attn"]
    # the class-attention layers: the CLS token's (H, 1, N + 1) attention, listed as not shown
    assert [(name, shape) for name, _, shape in vm.skipped] == [
        ("blocks_token_only.0.attn", (1, 4, 1, 17)), ("blocks_token_only.1.attn", (1, 4, 1, 17))]
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, maps = talking_heads_softmax(model, x)
    r = vm.run(x)
    assert r.attentions.shape == (2, 4, 16, 16)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


def test_cait_file_opens_with_its_code(tmp_path) -> None:
    """The route the refusal names for the command line: --code FILE.py:FACTORY with the file's weights."""
    model = cait()
    path = tmp_path / "cait_xxs24_224.pth"
    torch.save(model.state_dict(), path)
    code = tmp_path / "make_cait.py"
    code.write_text("import timm\n\n\ndef make():\n"
                    f"    return timm.create_model('cait_xxs24_224', pretrained=False, **{ARGS!r})\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiveWarning)
        vm = vitviz.load(path, code=f"{code}:make", device="cpu")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    out, maps = talking_heads_softmax(model, x)
    r = vm.run(x)
    np.testing.assert_allclose(r.attentions[-1], maps[-1][0].numpy(), atol=ATOL)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)
