"""What a new user's trial of the live path found (`scripts/trial_live.py`), each a regression test: attention the
module computes that vitviz could not show as computed is said (a `LiveWarning`, the provenance's path, the skipped
list), never shown silently as something else; models it can read are read.

- the softmax's output changed before it is applied (CaiT talking heads, a mask and re-normalisation after the
  softmax): the weights applied to the values are shown, said, naming the module and the call; `F.dropout(attn, p)`
  without `training=` (random): the softmax is shown, said as not what is applied; nn.Dropout in eval mode and
  reshapes, casts and slices on the way are not changes;
- (T, T) scores no softmax over the last axis follows (sigmoid or ReLU attention, a softmax over dim=-2) beside
  softmax layers: left out and said, not a silently shorter model; a bias made by a product and passed to SDPA as
  its mask is not such scores;
- a convolutional stem of several stride == kernel convolutions (2x2 three times: 8 px patches): the patch size
  from the token count, not the first convolution's 2 px (which refused the model, grid= could not help);
- attention computed one image at a time (a loop over the batch, (H, T, T) maps): loaded on one image, then every
  batch of two was refused as '2 heads where the model had 4'; now run one image at a time, exact, and said.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitviz
from vitviz.core.running.live import LiveWarning

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
DIM, HEADS = 32, 4


class Attention(nn.Module):
    """qkv attention; `style` says what happens between the scores and the product with the values."""

    def __init__(self, style: str = "plain") -> None:
        super().__init__()
        self.style, self.hd = style, DIM // HEADS
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mix = nn.Linear(HEADS, HEADS)
        self.drop = nn.Dropout(0.1)
        self.bias = nn.Parameter(torch.randn(HEADS, 4))
        self.applied: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, self.hd).permute(2, 0, 3, 1, 4)
        if self.style != "sdpa_bias":
            s = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        if self.style == "sigmoid":
            a = torch.sigmoid(s)
        elif self.style == "sdpa_bias":      # a bias made by a product, handed to SDPA as its float mask
            e = self.bias[None, :, None, :].expand(b, -1, n, -1)
            mask = e @ e.transpose(-2, -1)                       # (B, H, T, T)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.proj(o.transpose(1, 2).reshape(b, n, c))
        else:
            a = s.softmax(dim=-1)
        if self.style == "talking_heads":
            a = self.mix(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        elif self.style == "renormalised":
            a = a * (torch.arange(n, device=a.device) < n - 2)
            a = a / a.sum(-1, keepdim=True)
        elif self.style == "hard_dropout":
            a = F.dropout(a, 0.1)
        elif self.style == "plain":         # what is not a change: dropout off, casts, reshapes, a slice read
            a = self.drop(a).float().contiguous().view(b, HEADS, n, n)
            _ = a[:, :, 0].mean(1)
        self.applied = a.detach()
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, style: str) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(DIM), Attention(style)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class TinyViT(nn.Module):
    def __init__(self, *styles: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM))
        self.blocks = nn.ModuleList([Block(s) for s in styles])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


def _load(net: nn.Module) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vitviz.load(net, live=True, device="cpu")
    return model, [str(w.message) for w in caught if issubclass(w.category, LiveWarning)]


@pytest.mark.parametrize(("style", "call"), [("talking_heads", "by linear in blocks.1.attn.mix"),
                                             ("renormalised", "by mul")])
def test_a_softmax_output_changed_before_it_is_applied_is_shown_as_applied_and_said(style: str, call: str) -> None:
    """Talking heads, a re-normalisation: the weights that meet the values are shown (issue 31), said."""
    model, said = _load(TinyViT("plain", style))
    assert len(said) == 1 and "blocks.1.attn" in said[0] and call in said[0] and "blocks.0.attn" not in said[0]
    assert "the weights applied to the values" in said[0]
    assert "blocks.1.attn" in model.spec.source_of("path")
    x = torch.randn(2, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)      # as vitviz runs it: eval mode
    np.testing.assert_allclose(attn[:, 1], model.net.blocks[1].attn.applied.numpy(), atol=1e-6)
    np.testing.assert_allclose(attn[:, 0], model.net.blocks[0].attn.applied.numpy(), atol=1e-6)


def test_a_softmax_output_changed_at_random_before_it_is_applied_is_said() -> None:
    """Dropout in training mode is random: the softmax is shown, said as not what the module applies."""
    model, said = _load(TinyViT("plain", "hard_dropout"))
    call = "dropout(p=0.1) in training mode"
    assert len(said) == 1 and "blocks.1.attn" in said[0] and call in said[0] and "blocks.0.attn" not in said[0]
    assert "not the weights the module applies" in said[0]
    x = torch.randn(1, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)
    assert not np.allclose(attn[:, 1], model.net.blocks[1].attn.applied.numpy(), atol=1e-3)
    np.testing.assert_allclose(attn[:, 0], model.net.blocks[0].attn.applied.numpy(), atol=1e-6)


def test_dropout_off_casts_reshapes_and_reads_are_not_changes() -> None:
    model, said = _load(TinyViT("plain", "plain"))
    assert said == [] and "changed" not in model.spec.source_of("path")
    assert [m for _, m in model.layers] == ["softmax", "softmax"]


def test_scores_without_a_softmax_beside_softmax_layers_are_left_out_and_said() -> None:
    model, said = _load(TinyViT("plain", "sigmoid", "plain"))
    assert [n for n, _ in model.layers] == ["blocks.0.attn", "blocks.2.attn"]     # the sigmoid layer is not shown
    assert len(said) == 1 and "blocks.1.attn" in said[0] and "no softmax over their last axis" in said[0]
    assert [(n, shape) for n, m, shape in model.skipped if "no softmax" in m] == [("blocks.1.attn", (1, 4, 17, 17))]


def test_only_sigmoid_attention_is_refused_naming_the_scores() -> None:
    with pytest.raises(vitviz.core.running.live.NoAttentionError, match=r"blocks\.0\.attn 17x17 scores with no softmax"):
        vitviz.load(TinyViT("sigmoid", "sigmoid"), live=True, device="cpu")


def test_a_product_made_bias_given_to_sdpa_is_not_scores_without_a_softmax() -> None:
    model, said = _load(TinyViT("sdpa_bias", "plain"))
    assert said == [] and not [s for s in model.skipped if "no softmax" in s[1]]
    assert [m for _, m in model.layers] == ["scaled_dot_product_attention", "softmax"]


class StemViT(TinyViT):
    """A hybrid stem: three 2x2 stride-2 convolutions, 8 px patches in all."""

    def __init__(self) -> None:
        super().__init__("plain", "plain")
        self.patch_embed = nn.Sequential(nn.Conv2d(3, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
                                         nn.Conv2d(16, 16, 2, 2), nn.ReLU(), nn.Conv2d(16, DIM, 2, 2))


def test_a_stem_of_patchify_convolutions_takes_the_patch_size_from_the_tokens() -> None:
    model, said = _load(StemViT())
    s = model.spec
    assert (s.image_size, s.patch_size, s.grid, s.embed_dim, s.prefix_names, s.pos_embed) == \
        ((32, 32), 8, (4, 4), DIM, ("cls",), True)
    assert "more downsampling follows it" in s.source_of("patch_size") and "cut in the forward" not in \
        s.source_of("patch_size")
    x = torch.randn(2, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)
    for i, blk in enumerate(model.net.blocks):
        np.testing.assert_allclose(attn[:, i], blk.attn.applied.numpy(), atol=1e-6)


class PerImageAttention(Attention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, self.hd).permute(2, 0, 3, 1, 4)
        maps = [torch.softmax(q[i] @ k[i].transpose(-2, -1) / math.sqrt(self.hd), dim=-1) for i in range(b)]
        self.applied = torch.stack(maps).detach()
        out = torch.stack([m @ v[i] for i, m in enumerate(maps)])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


def test_attention_computed_one_image_at_a_time_runs_a_batch_image_by_image() -> None:
    net = TinyViT("plain", "plain")
    for blk in net.blocks:
        blk.attn = PerImageAttention()
    model, said = _load(net)
    assert model.layout.per_image and "one image at a time" in model.spec.source_of("path")
    x = torch.randn(3, 3, 32, 32)
    attn, out = model.forward_captured(x)
    with torch.inference_mode():
        own = model.net.eval()(x)
    assert attn.shape == (3, 2, HEADS, 17, 17)
    for i, blk in enumerate(model.net.blocks):
        np.testing.assert_allclose(attn[:, i], blk.attn.applied.numpy(), atol=1e-6)
    np.testing.assert_allclose(out, own.numpy(), atol=1e-5)
    maps, _ = model.forward_captured(x, logits=False, upto=0)
    assert maps.shape == (3, 1, HEADS, 17, 17)


def sigmoid_between() -> nn.Module:
    """A factory for `--code`: a sigmoid "attention" between two softmax layers."""
    torch.manual_seed(0)
    return TinyViT("plain", "sigmoid", "plain").eval()


def test_vitviz_info_lists_what_the_live_path_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    """`vitviz info --code` says which attention calls it saw but did not show (text and JSON), not only the GUI."""
    from vitviz.cli import main

    code = f"{Path(__file__)}:sigmoid_between"
    assert main(["info", "--code", code]) == 0
    text = capsys.readouterr().out
    assert re.search(r"skipped\s+blocks\.1\.attn\s+.*no softmax.*\(1, 4, 17, 17\)", text), text
    assert main(["info", "--code", code, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["module"] for s in data["skipped_attention"]] == ["blocks.1.attn"]
    assert [a["module"] for a in data["attention_layers"]] == ["blocks.0.attn", "blocks.2.attn"]
