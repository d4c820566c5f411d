"""The "Vision Transformers from scratch" tutorial ViT (Brian Pulfer's `MyViT` / `MyMSA`, `tutorial_refs.MyViT`)
by both routes, exactly:

- by file: its per-head `q_mappings.h` / `k_mappings.h` / `v_mappings.h` Linears (each on its head's slice of the
  token) read as one block-diagonal qkv, the head count derived from them, its unsaved 1-D sin-cos table computed
  (a said guess), its other settings assumed as for any hand-written layout;
- live (`vitviz.load(module, live=True)`, `code="file.py:factory"`): its 2-D (T, T) softmaxes, one per image per
  head in Python loops, grouped into (B, H, T, T) layers;
- and the refusal when 2-D maps cannot be told apart by layer, which names what it saw and what to pass.

Each case builds the original with random weights (every parameter perturbed), and compares the logits (the
tutorial's `mlp` ends in a Softmax: vitviz's logits are before it, its probabilities after) and every layer's
per-head attention at atol 1e-5.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import vitviz
from parity_refs import perturb
from tutorial_refs import MyMSA, MyViT, MyViTFirst, PerHeadViT, my_vit_reference, patchify, stored_attention_reference
from vitviz.core.running.live import NoAttentionError
from vitviz.core.spec import GuessWarning
from vitviz.errors import OverrideError, UnknownLayoutError

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")

ATOL = 1e-5


def images(n: int = 3, c: int = 1, size: int = 28) -> torch.Tensor:
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(1))


def assert_same(maps: np.ndarray, ref_maps: list[torch.Tensor], image: int = 0) -> None:
    """`maps` (L, H, T, T) against the reference's per-layer (B, H, T, T) for one image."""
    assert maps.shape == (len(ref_maps), *ref_maps[0].shape[1:])
    for i, ref in enumerate(ref_maps):
        np.testing.assert_allclose(maps[i], ref[image].numpy(), atol=ATOL, err_msg=f"layer {i}")


# --------------------------------------------------------------------------------------------------- by file
SCRATCH_CASES = {
    "mnist_buffer": (dict(), dict(image_size=28)),                        # the tutorial as published since 2022-09
    "mnist_pos_param": (dict(pos_param=True), {}),                         # its 2022 version: the table is saved
    "mnist_width_16": (dict(hidden_d=16, n_heads=4), {}),                # linear_mapper (16, 16): as wide as D
    "rgb_four_heads": (dict(chw=(3, 28, 28), hidden_d=16, n_heads=4, n_blocks=3),
                       dict(image_size=28, patch_order="cp1p2")),          # patchify flattens (c, p1, p2)
}


@pytest.mark.parametrize("case", list(SCRATCH_CASES))
def test_scratch_tutorial_by_file(tmp_path, case: str) -> None:
    kwargs, overrides = SCRATCH_CASES[case]
    kwargs = {"chw": (1, 28, 28), **kwargs}
    model = perturb(MyViT(**kwargs))
    torch.save(model.state_dict(), tmp_path / "vit_mnist.pt")
    with pytest.warns(GuessWarning) as said:
        vm = vitviz.load(tmp_path / "vit_mnist.pt", device="cpu", **overrides)
    s = vm.spec
    heads = kwargs.get("n_heads", 2)
    assert s.family == "structural" and s.num_heads == heads and not s.heads_guessed
    assert s.source_of("num_heads").startswith(f"shape: {heads} per-head")
    assert s.embed_dim == kwargs.get("hidden_d", 8) and s.depth == kwargs.get("n_blocks", 2)
    assert s.patch_size == 4 and s.in_chans == kwargs["chw"][0] and s.cls_token and s.pooling == "token"
    assert s.num_params == sum(p.numel() for p in model.parameters())  # the block-diagonal's zeros not counted
    text = " ".join(str(w.message) for w in said)
    assert "num_heads" not in text  # derived from the per-head modules, never guessed
    for assumed in ("attn_scale", "block_norm", "eps", "mlp_kind"):  # what no tensor says stays flagged
        assert assumed in text
    if kwargs.get("pos_param"):
        assert s.pos_kind == "learned" and s.pos_grid == (7, 7) and "pos_kind" not in text
    else:
        assert s.pos_kind == "sincos1d" and s.pos_prefix == 1 and s.source_of("pos_kind").startswith("guess")
        assert "pos_kind='sincos1d'|'sincos2d'|'none'" in text
    x = images(3, c=kwargs["chw"][0])
    probs, logits, ref_maps = my_vit_reference(model, x)
    for b in range(3):
        r = vm.run(x[b:b + 1])
        assert_same(r.attentions, ref_maps, b)
        np.testing.assert_allclose(r.logits, logits[b].numpy(), atol=ATOL)
        np.testing.assert_allclose(torch.softmax(torch.from_numpy(r.logits), -1).numpy(), probs[b].numpy(),
                                   atol=ATOL)


def test_scratch_tutorial_pos_kind_override(tmp_path) -> None:
    """pos_kind= answers the table a file does not hold; a file that holds one refuses it. Without image_size=,
    a 1-channel file with no table is taken as MNIST's 28 px, said as a guess."""
    model = perturb(MyViT((1, 28, 28)))
    torch.save(model.state_dict(), tmp_path / "m.pt")
    with pytest.warns(GuessWarning, match=r"28 px, MNIST's size; if that is wrong, pass image_size=N"):
        bare = vitviz.load(tmp_path / "m.pt", device="cpu")
    assert bare.spec.image_size == (28, 28) and bare.spec.pos_grid == (7, 7)
    none = vitviz.load(tmp_path / "m.pt", image_size=28, pos_kind="none", device="cpu")
    assert not none.spec.pos_embed and none.spec.source_of("pos_kind") == "override"
    right = vitviz.load(tmp_path / "m.pt", image_size=28, pos_kind="sincos1d", device="cpu")
    assert right.spec.source_of("pos_kind") == "override" and right.spec.pos_embed
    x = images(1)
    _, logits, ref_maps = my_vit_reference(model, x)
    for vm in (right, bare):
        r = vm.run(x)
        assert_same(r.attentions, ref_maps)
        np.testing.assert_allclose(r.logits, logits[0].numpy(), atol=ATOL)
    assert not np.allclose(none.run(x).logits, logits[0].numpy(), atol=1e-3)  # the table matters
    saved = perturb(MyViT((1, 28, 28), pos_param=True))
    torch.save(saved.state_dict(), tmp_path / "p.pt")
    with pytest.raises(OverrideError, match=r"pos_kind='sincos1d', but the file holds a position table pos_embed"):
        vitviz.load(tmp_path / "p.pt", pos_kind="sincos1d")
    with pytest.raises(OverrideError, match=r"heads=4, but each block holds 2 per-head query/key/value modules"):
        vitviz.load(tmp_path / "m.pt", image_size=28, heads=4)   # the structure says 2: a wrong answer is refused


def test_per_head_list_of_full_width_linears(tmp_path) -> None:
    """Per-head lists whose Linears each read the whole token (`queries.h` (hd, D)): stacked, not block-diagonal;
    the head count is derived as well."""
    model = perturb(PerHeadViT())
    sd = {}
    for k, v in model.state_dict().items():  # attention.heads.H.query -> attention.queries.H (a ModuleList per role)
        for role, plural in (("query", "queries"), ("key", "keys"), ("value", "values")):
            k = k.replace(f".heads.{k.split('.heads.')[-1].split('.')[0]}.{role}.",
                          f".{plural}.{k.split('.heads.')[-1].split('.')[0]}.") if ".heads." in k else k
        sd[k] = v
    assert "encoder.blocks.0.attention.queries.2.weight" in sd
    torch.save(sd, tmp_path / "lists.pt")
    vm = vitviz.load(tmp_path / "lists.pt", device="cpu")
    assert vm.spec.num_heads == 3 and vm.spec.source_of("num_heads").startswith("shape: 3 per-head")
    x = images(1, c=3, size=32)
    out, maps = stored_attention_reference(model, x, model.attentions())
    r = vm.run(x)
    assert_same(r.attentions, maps)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


# ------------------------------------------------------------------------------------------------------- live
def test_scratch_tutorial_live(tmp_path) -> None:
    """The module as written: 2-D softmaxes in loops over images and heads -> (L, H, T, T), a batch included."""
    model = perturb(MyViT((1, 28, 28), hidden_d=16, n_heads=4, n_blocks=3))
    vm = vitviz.load(model, live=True)
    assert vm.spec.family == "live" and (vm.spec.depth, vm.spec.num_heads) == (3, 4)
    assert [name for name, _ in vm.layers] == ["blocks.0.mhsa", "blocks.1.mhsa", "blocks.2.mhsa"]
    assert vm.layout.two_d and not vm.layout.head_major and not vm.layout.per_image
    assert "one 2-D (T, T) map per image per head" in vm.spec.source_of("path")
    x = images(3)
    probs, _, ref_maps = my_vit_reference(model, x)
    maps, out = vm.forward_captured(x)
    for b in range(3):
        assert_same(maps[b], ref_maps, b)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)    # its own output: the tutorial's probabilities
    r = vm.run(x[1:2])
    assert_same(r.attentions, ref_maps, 1)


def test_scratch_tutorial_by_code(tmp_path) -> None:
    """`code="file.py:factory"` with the weights file: the same maps as the module's own."""
    model = perturb(MyViT((1, 28, 28)))
    torch.save(model.state_dict(), tmp_path / "vit_mnist.pt")
    (tmp_path / "scratch.py").write_text("from tutorial_refs import MyViT\n\n\ndef make():\n"
                                         "    return MyViT((1, 28, 28), n_patches=7, n_blocks=2, hidden_d=8, "
                                         "n_heads=2, out_d=10)\n")
    vm = vitviz.load(tmp_path / "vit_mnist.pt", code=f"{tmp_path / 'scratch.py'}:make")
    assert (vm.spec.depth, vm.spec.num_heads, vm.spec.image_size) == (2, 2, (28, 28))
    x = images(2)
    probs, _, ref_maps = my_vit_reference(model, x)
    maps, out = vm.forward_captured(x)
    for b in range(2):
        assert_same(maps[b], ref_maps, b)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)


class HeadsOuterMSA(MyMSA):
    """The tutorial's attention with its loops swapped: heads outside, images inside (call order h*B + b)."""

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        per_head = []
        for head in range(self.n_heads):
            rows = []
            for sequence in sequences:
                seq = sequence[:, head * self.d_head:(head + 1) * self.d_head]
                q, k, v = self.q_mappings[head](seq), self.k_mappings[head](seq), self.v_mappings[head](seq)
                rows.append(self.softmax(q @ k.T / (self.d_head ** 0.5)) @ v)   # (T, T) @ (T, hd)
            per_head.append(torch.stack(rows))                                   # (B, T, hd)
        return torch.cat(per_head, dim=-1)                                       # (B, T, H*hd)


def test_scratch_tutorial_heads_outside_images_live() -> None:
    model = MyViT((1, 28, 28), hidden_d=12, n_heads=3)
    for block in model.blocks:
        old = block.mhsa
        block.mhsa = HeadsOuterMSA(12, 3)
        block.mhsa.load_state_dict(old.state_dict())
    model = perturb(model)
    vm = vitviz.load(model, live=True)
    assert vm.layout.two_d and vm.layout.head_major
    x = images(2)
    calls: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    hooks = [b.mhsa.softmax.register_forward_hook(lambda _m, _i, o, i=i: calls[i].append(o.detach()))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        probs = model(x)
    for h in hooks:
        h.remove()
    ref = [torch.stack(calls[i]).reshape(3, 2, 50, 50).transpose(0, 1) for i in calls]   # (H, B) -> (B, H, T, T)
    maps, out = vm.forward_captured(x)
    for b in range(2):
        assert_same(maps[b], ref, b)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)


# ---------------------------------------------------------------------------------------------------- refusal
class FlatScratchViT(MyViT):
    """The tutorial's weights with every block computed inline in the model's own forward: no attention module
    around the (T, T) softmaxes, so nothing tells one layer's maps from the next one's."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n = images.shape[0]
        out = torch.cat((self.class_token.expand(n, 1, -1), self.linear_mapper(patchify(images, self.n_patches))),
                        dim=1) + self.positional_embeddings.repeat(n, 1, 1)
        for block in self.blocks:
            m, y = block.mhsa, block.norm1(out)
            result = []
            for sequence in y:
                heads = []
                for h in range(m.n_heads):
                    seq = sequence[:, h * m.d_head:(h + 1) * m.d_head]
                    q, k, v = m.q_mappings[h](seq), m.k_mappings[h](seq), m.v_mappings[h](seq)
                    heads.append(torch.softmax(q @ k.T / m.d_head ** 0.5, dim=-1) @ v)
                result.append(torch.hstack(heads))
            out = out + torch.stack(result)
            out = out + block.mlp(block.norm2(out))
        return self.mlp(out[:, 0])


def test_maps_that_cannot_be_told_apart_are_refused_with_the_next_step() -> None:
    model = perturb(FlatScratchViT((1, 28, 28)))
    with pytest.raises(NoAttentionError) as e:
        vitviz.load(model, live=True)
    msg = str(e.value)
    assert "saw attention but could not tell its maps apart as the heads of one layer" in msg
    assert "4 softmaxes of shape (50, 50) in (top level)" in msg and "model's own forward" in msg
    assert "heads=N (CLI --heads N)" in msg and "N one of 1, 2" in msg
    assert "not a Vision Transformer" not in msg and "no self-attention was seen" not in msg
    vm = vitviz.load(model, live=True, heads=2)       # the route it names: each 2 maps per image are one layer
    assert (vm.spec.depth, vm.spec.num_heads) == (2, 2)
    ref = MyViT((1, 28, 28))
    ref.load_state_dict(model.state_dict())
    x = images(2)
    probs, _, ref_maps = my_vit_reference(ref.eval(), x)
    maps, out = vm.forward_captured(x)
    for b in range(2):
        assert_same(maps[b], ref_maps, b)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)
    with pytest.raises(NoAttentionError, match=r"heads=3 was given, but the maps do not divide into layers of 3"):
        vitviz.load(model, live=True, heads=3)


def test_file_without_attention_modules_is_no_longer_not_a_vit(tmp_path) -> None:
    """The tutorial's file was 'not a Vision Transformer' (no q/k/v names): it is recognised by its lists."""
    from vitviz.core.reading.families.structural import is_attention_shaped

    sd = MyViT((1, 28, 28)).state_dict()
    assert is_attention_shaped(sd)
    renamed = {k.replace("q_mappings", "a").replace("k_mappings", "b").replace("v_mappings", "c"): v
               for k, v in sd.items()}
    assert not is_attention_shaped(renamed)   # names that say nothing: the refusal says which route opens it
    torch.save(renamed, tmp_path / "renamed.pt")
    with pytest.raises(UnknownLayoutError, match="no attention weights") as e:
        vitviz.load(tmp_path / "renamed.pt")
    assert "q_mappings.N" in str(e.value) and "--code FILE.py:FACTORY" in str(e.value)


class SliceHead(nn.Module):
    """One head with its own query/key/value Linear(hd, hd) on its slice of an unbatched (T, D) sequence."""

    def __init__(self, d_head: int, index: int) -> None:
        super().__init__()
        self.index, self.d_head = index, d_head
        self.query, self.key, self.value = (nn.Linear(d_head, d_head) for _ in range(3))

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        seq = sequence[:, self.index * self.d_head:(self.index + 1) * self.d_head]          # (T, hd)
        q, k, v = self.query(seq), self.key(seq), self.value(seq)
        return torch.softmax(q @ k.T / self.d_head ** 0.5, dim=-1) @ v                   # (T, T) @ (T, hd)


class SliceHeadsMSA(nn.Module):
    """`heads.h.query/key/value` modules, each called once per image: 2-D maps from sibling modules."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(SliceHead(d // n_heads, h) for h in range(n_heads))

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.cat([head(seq) for head in self.heads], dim=-1) for seq in sequences])


def test_head_modules_on_slices_by_file_and_live(tmp_path) -> None:
    """`mhsa.heads.h.query` (hd, hd) on each head's slice: block-diagonal by file; by module, the 2-D maps of
    sibling head modules called per image are one layer."""
    model = MyViT((1, 28, 28), hidden_d=12, n_heads=3)
    for block in model.blocks:
        block.mhsa = SliceHeadsMSA(12, 3)
    model = perturb(model)
    torch.save(model.state_dict(), tmp_path / "heads.pt")
    by_file = vitviz.load(tmp_path / "heads.pt", image_size=28, device="cpu")
    assert by_file.spec.num_heads == 3 and by_file.spec.embed_dim == 12 and not by_file.spec.heads_guessed
    live = vitviz.load(model, live=True)
    assert [name for name, _ in live.layers] == ["blocks.0.mhsa", "blocks.1.mhsa"] and live.layout.two_d
    x = images(2)
    maps, out = live.forward_captured(x)
    with torch.no_grad():
        probs = model(x)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)
    for b in range(2):
        r = by_file.run(x[b:b + 1])
        np.testing.assert_allclose(r.attentions, maps[b], atol=ATOL)
        np.testing.assert_allclose(torch.softmax(torch.from_numpy(r.logits), -1).numpy(), probs[b].numpy(),
                                   atol=ATOL)


def test_two_class_head_softmax_is_no_attention_map() -> None:
    """A 2-class tutorial model's final Softmax over a batch of two is a (2, 2) 2-D softmax at the top level: not
    taken for attention (nor for a sign that the model runs one image at a time)."""
    model = perturb(MyViT((1, 28, 28), out_d=2))
    vm = vitviz.load(model, live=True)
    assert vm.layout.two_d and not vm.layout.per_image and vm.spec.num_classes == 2
    x = images(2)
    probs, _, ref_maps = my_vit_reference(model, x)
    maps, out = vm.forward_captured(x)
    for b in range(2):
        assert_same(maps[b], ref_maps, b)
    np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)


def test_first_version_refused_by_file_and_exact_live(tmp_path) -> None:
    """The tutorial's first version (one block written out in the model, LayerNorm over the whole (T, D)
    sequence, a one-Linear MLP) is no ViT the reference expresses: its file is refused naming the single block and
    the --code route; that route, and the module itself, give its exact attention."""
    model = perturb(MyViTFirst((1, 28, 28)))
    torch.save(model.state_dict(), tmp_path / "first.pt")
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(tmp_path / "first.pt")
    msg = str(e.value)
    assert "one attention with per-head q/k/v lists (msa) outside any stack of blocks" in msg
    assert "--code FILE.py:FACTORY" in msg and "not a Vision Transformer" not in msg
    (tmp_path / "first_code.py").write_text("from tutorial_refs import MyViTFirst\n\n\ndef make():\n"
                                            "    return MyViTFirst((1, 28, 28))\n")
    calls: list[torch.Tensor] = []
    hook = model.msa.softmax.register_forward_hook(lambda _m, _i, o: calls.append(o.detach()))
    x = images(2)
    with torch.no_grad():
        probs = model(x)
    hook.remove()
    ref = [torch.stack(calls).reshape(2, 2, 50, 50)]                                  # (B*H, T, T) -> (B, H, T, T)
    for vm in (vitviz.load(model, live=True), vitviz.load(tmp_path / "first.pt", code=f"{tmp_path / 'first_code.py'}:make")):
        assert [name for name, _ in vm.layers] == ["msa"] and vm.spec.num_heads == 2
        maps, out = vm.forward_captured(x)
        for b in range(2):
            assert_same(maps[b], ref, b)
        np.testing.assert_allclose(out, probs.numpy(), atol=ATOL)


def test_scratch_tutorial_file_is_verified_against_its_own_code(tmp_path, capsys) -> None:
    """`vitviz verify vit_mnist.pt --code tutorial.py:make_model`, as the tutorial's reader would: the model ends
    in a Softmax, so its probabilities are compared with the softmax of vitviz's logits; the verdict is verified,
    every assumption the probe reaches becomes verified (only the image preprocessing stays assumed), and a size the
    tutorial's fixed table cannot take is skipped and said."""
    from vitviz.cli import main
    from vitviz.core.analyses.verify import apply_verification, verify

    model = perturb(MyViT(chw=(1, 28, 28)))
    torch.save(model.state_dict(), tmp_path / "vit_mnist.pt")
    code = tmp_path / "tutorial.py"
    code.write_text("from tutorial_refs import MyViT\n\n\ndef make_model():\n    return MyViT(chw=(1, 28, 28))\n")
    with pytest.warns(GuessWarning):
        vm = vitviz.load(tmp_path / "vit_mnist.pt", device="cpu")
    assumed = {name for name, _ in vm.spec.assumptions}
    assert {"mlp_kind", "eps", "attn_scale", "block_norm"} <= assumed
    check = verify(vm, code=f"{code}:make_model")
    assert check.verdict == "verified" and check.summary().startswith("Verified against tutorial.py:make_model")
    assert check.sizes == ((28, 28),) and "cannot run at 36x36" in check.skipped[0][1]
    assert set(check.confirmed) == assumed - {"preprocess"}
    apply_verification(vm, check)
    assert [name for name, _ in vm.spec.assumptions] == ["preprocess"]
    assert vm.spec.kind_of("block_norm") == "verified"
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "vit_mnist.pt"), "--code", f"{code}:make_model"]) == 0
    out = capsys.readouterr().out
    assert "assumptions (1):" in out and "verified (" in out and out.splitlines()[-1].startswith("Verified against")
