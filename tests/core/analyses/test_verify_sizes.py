"""verify's second probe size (issue 36): compared only where the model computes something that depends on the
input size (a position table resampled, RoPE, a relative position bias), and said when it is left out."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.core.analyses import verify as verify_module
from vitviz.core.analyses.verify import _STREAMED_LAYERS, from_dict, verify
from vitviz.core.running.runtime import format_bytes
from vitviz.errors import VitvizError

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


def _folder(tmp_path: Path, **extra: object) -> Path:
    torch.manual_seed(0)
    args = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, **extra}
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
    timm.models._hub.save_for_hf(model, str(tmp_path / "timm"), model_args=args, safe_serialization=True)
    return tmp_path / "timm"


def test_no_position_table_compares_the_native_size_only(tmp_path: Path) -> None:
    model = vitviz.load(_folder(tmp_path, pos_embed="none"), device="cpu", rope="none")   # no positions at all
    assert not model.spec.pos_embed and not model.spec.rope and not model.spec.rel_pos
    check = verify(model)
    assert check.verified, check.summary()
    assert check.sizes == ((32, 32),) and not check.skipped
    assert "nothing in the model depends on the input size" in check.one_size
    assert check.summary().endswith("; at 32x32 only)")
    assert from_dict(check.to_dict()).one_size == check.one_size   # remembered with the verdict
    # sizes the caller names are compared, whatever the model
    asked = verify(model, sizes=[32, 48])
    assert asked.sizes == ((32, 32), (48, 48)) and asked.one_size == ""


def test_a_position_table_is_compared_at_another_size(tmp_path: Path) -> None:
    model = vitviz.load(_folder(tmp_path), device="cpu")
    check = verify(model)
    assert check.verified, check.summary()
    assert check.sizes == ((32, 32), (48, 48)) and check.one_size == ""
    assert "only" not in check.summary()


def test_an_original_built_per_size_is_held_one_size_at_a_time() -> None:
    """open_clip's and torchvision's originals (`_one_size_at_a_time`): the same size again is the module built
    before, another size lets it go first, and a non-square other size is refused with the native one still held."""
    from vitviz.core.analyses.verify import _CannotRun, _one_size_at_a_time

    made: list[tuple[int, int]] = []

    def make(size: tuple[int, int]) -> torch.nn.Module:
        made.append(size)
        return torch.nn.Identity()

    build = _one_size_at_a_time(make, (32, 32), "square grids only")
    native = build((32, 32))
    assert build((32, 32)) is native and made == [(32, 32)]
    with pytest.raises(_CannotRun, match="square grids only"):
        build((32, 48))
    assert build((32, 32)) is native and made == [(32, 32)]     # the refusal let nothing go
    other = build((48, 48))
    assert other is not native and build((48, 48)) is other
    assert build((32, 32)) is not native and made == [(32, 32), (48, 48), (32, 32)]   # one held at a time


def test_a_size_is_refused_by_what_its_comparison_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A size is refused by the attention its comparison holds at once, not by a whole stack for every route: where
    both models hand each layer over as they compute it, a few layers (`_STREAMED_LAYERS`), so a deep model's size
    whose whole stack exceeds the memory available is compared; one whose few layers exceed it is refused, the
    message naming the size, the bytes needed and those available; and where vitviz's model gives its whole stack
    (no `forward_streamed`) that stack is counted, so the first size is refused too."""
    depth = _STREAMED_LAYERS + 6
    model = vitviz.load(_folder(tmp_path, depth=depth), device="cpu")
    heads = model.spec.num_heads

    def layer(tokens: int) -> int:
        return heads * tokens * tokens * 4

    free = (_STREAMED_LAYERS + 1) * layer(17)   # 32 px: 4 x 4 patches and the class token
    monkeypatch.setattr(verify_module, "available_memory", lambda: free)
    assert depth * layer(17) > free   # the whole stack at 32 px does not fit
    check = verify(model, sizes=[32])
    assert check.verified and check.sizes == ((32, 32),), check.summary()
    needed = _STREAMED_LAYERS * layer(26)   # 40 px: 5 x 5 patches and the class token
    with pytest.raises(VitvizError, match=rf"size \(40, 40\): .*26 tokens .*needs {format_bytes(needed)}, more than "
                                          rf"the {format_bytes(free)} available; expected a smaller size"):
        verify(model, sizes=[40])
    model.forward_streamed = None   # its whole stack, from forward_captured
    whole = (depth + verify_module._BESIDE_STACK) * layer(17)
    with pytest.raises(VitvizError, match=rf"size \(32, 32\): .*whole stack of {depth} .*needs {format_bytes(whole)}, "
                                          rf"more than the {format_bytes(free)} available"):
        verify(model, sizes=[32])
    monkeypatch.setattr(verify_module, "available_memory", lambda: whole)
    assert verify(model, sizes=[32]).verified   # compared from its whole stack where that fits
