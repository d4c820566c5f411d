"""Verification in bounded memory (issue 36): `verify` never holds the original's and vitviz's full attention
stacks at once.

Every map either model computes is watched through a weak reference: the original's per-layer maps as its run
returns them, vitviz's as its softmax probes give them (a capture that writes into one (B, L, H, T, T) array is
counted as that whole array). At every softmax of vitviz's forward and at the end of every run of the original,
the bytes of maps still alive are summed; they must stay within one full (L, H, T, T) stack plus one layer.
Holding both stacks (the original's maps kept while vitviz captures all of its own, or vitviz's kept while the
original runs) is twice that.
"""
from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import vitviz
from vitviz.core.analyses import verify as verify_module
from vitviz.core.running.model import AttentionProbe

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
DEPTH, HEADS = 4, 2


class _Watch:
    """Weak references to every attention map alive, and the largest total (bytes) seen relative to a stack."""

    def __init__(self) -> None:
        self.maps: dict[int, weakref.ref] = {}
        self.worst = 0.0   # the most bytes of maps alive at once, in full (L, H, T, T) float32 stacks
        self.samples = 0

    def add(self, array: Any) -> None:
        self.maps[id(array)] = weakref.ref(array)

    def sample(self, tokens: int) -> None:
        stack = DEPTH * HEADS * tokens * tokens * 4
        alive = [r() for r in self.maps.values()]
        held = sum(a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size() for a in alive if a is not None)
        self.worst = max(self.worst, held / stack)
        self.samples += 1


def _watched(monkeypatch: pytest.MonkeyPatch, model: Any) -> _Watch:
    watch = _Watch()

    class Counted(verify_module._Original):
        """The original, its maps watched as each run returns them."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            run = self.run

            def counted(size: tuple[int, int], x: torch.Tensor) -> Any:
                maps, out = run(size, x)
                for m in maps:
                    watch.add(m)
                watch.sample(int(maps[0].shape[-1]))
                return maps, out
            self.run = counted

    def seen(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        watch.add(out._base if out._base is not None else out)   # a view of a capture's whole array: the array
        watch.sample(int(out.shape[-1]))

    monkeypatch.setattr(verify_module, "_Original", Counted)
    for m in model.net.modules():
        if isinstance(m, AttentionProbe):
            m.register_forward_hook(seen)
    return watch


def _timm_folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    args = dict(img_size=64, patch_size=8, embed_dim=32, depth=DEPTH, num_heads=HEADS)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
    timm.models._hub.save_for_hf(model, str(tmp_path / "timm"), model_args=args, safe_serialization=True)
    return tmp_path / "timm"


def _transformers_folder(tmp_path: Path) -> Path:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=32, num_hidden_layers=DEPTH, num_attention_heads=HEADS, intermediate_size=64,
                       image_size=64, patch_size=8, num_labels=3)
    ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


@pytest.mark.parametrize("make", [_timm_folder, _transformers_folder], ids=["timm", "transformers"])
def test_verify_never_holds_both_full_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    model = vitviz.load(make(tmp_path), device="cpu")
    watch = _watched(monkeypatch, model)
    check = verify_module.verify(model)
    assert check.verified, check.summary()
    assert len(check.sizes) == 2 and all(len(layers) == DEPTH for layers in check.per_layer)
    assert watch.samples >= 2 * (DEPTH + 1)   # every softmax of vitviz's and every run of the original was seen
    one_layer = 1 / DEPTH
    assert watch.worst <= 1 + one_layer + 1e-9, (
        f"{watch.worst:.2f} full attention stacks alive at once (at most one stack and one layer expected)")
    assert watch.worst >= 1   # the measurement sees the original's whole stack (it can fail)
