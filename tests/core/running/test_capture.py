"""Capture end to end: images in, attention out; hooks leave no trace; resolution and position embeddings."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitviz
from _tiny import write_tiny_checkpoint
from vitviz.core.analyses import analysis
from vitviz.core.running.model import AttentionProbe


@pytest.fixture()
def tiny(tmp_path):
    return vitviz.load(write_tiny_checkpoint(tmp_path / "m.pth", reg_tokens=2), heads=2, device="cpu")


def test_run_from_path_pil_and_array(tmp_path, tiny) -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (50, 70, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "img.png")
    a = tiny.run(tmp_path / "img.png")
    b = tiny.run(Image.fromarray(arr))
    c = tiny.run(arr)
    assert a.attentions.shape == (2, 2, 3 + 16, 3 + 16) and a.attentions.dtype == np.float32
    np.testing.assert_array_equal(a.attentions, b.attentions)
    np.testing.assert_array_equal(a.logits, c.logits)
    assert a.image.shape == (32, 32, 3) and a.image.dtype == np.uint8 and a.source.endswith("img.png")
    assert a.spec.prefix_names == ("cls", "reg0", "reg1")


def test_capture_does_not_change_output_and_removes_hooks(tiny) -> None:
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        plain = tiny.net(x)
    r = tiny.run(x)
    np.testing.assert_array_equal(r.logits, plain[0].numpy())
    probes = [m for m in tiny.net.modules() if isinstance(m, AttentionProbe)]
    assert len(probes) == 2 and all(not p._forward_hooks for p in probes)


def test_attention_only_pass_skips_the_tail_and_keeps_the_maps(tiny) -> None:
    x = torch.rand(2, 3, 32, 32)
    full, logits = tiny.forward_captured(x)
    calls: list[str] = []
    last = tiny.net.blocks[-1]
    hooks = [last.mlp.register_forward_hook(lambda *_: calls.append("mlp")),
             last.attn.proj.register_forward_hook(lambda *_: calls.append("proj")),
             tiny.net.head.register_forward_hook(lambda *_: calls.append("head"))]
    try:
        fast, none = tiny.forward_captured(x, logits=False)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [] and none.shape == (2, 0) and logits.shape == (2, 5)
    assert fast.shape == full.shape == (2, 2, 2, 19, 19)
    np.testing.assert_allclose(fast, full, atol=1e-6)
    first, _ = tiny.forward_captured(x, logits=False, upto=0)
    assert first.shape == (2, 1, 2, 19, 19)
    np.testing.assert_allclose(first[:, 0], full[:, 0], atol=1e-6)
    r = tiny.run(x[:1], logits=False)
    assert r.logits.shape == (0,) and r.top_k() == []
    np.testing.assert_allclose(r.attentions, full[0], atol=1e-6)


def test_maps_too_large_for_memory_are_refused_with_a_clear_message(tiny, monkeypatch) -> None:
    from vitviz.core.running import runtime as memory
    x = torch.rand(3, 3, 32, 32)
    needed = 3 * 2 * 2 * 19 * 19 * 4  # B * L * H * T^2 * float32
    monkeypatch.setattr(memory, "available_memory", lambda: needed - 1)
    with pytest.raises(vitviz.DeviceError, match=r"input \(3, 3, 32, 32\) need .* GiB \(float32\).*half=True"):
        tiny.forward_captured(x)
    tiny.forward_captured(x, half=True)  # float16 maps take half: they fit
    monkeypatch.setattr(memory, "available_memory", lambda: needed)
    assert tiny.forward_captured(x)[0].nbytes == needed


def test_allocation_failure_during_the_run_becomes_device_error(tiny, monkeypatch) -> None:
    def fail(*_a, **_k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(tiny.net, "forward", fail)
    with pytest.raises(vitviz.DeviceError, match="not enough memory for input .*smaller image size"):
        tiny.run(torch.rand(1, 3, 32, 32))

    def other(*_a, **_k):
        raise RuntimeError("a bug, not memory")

    monkeypatch.setattr(tiny.net, "forward", other)
    with pytest.raises(RuntimeError, match="a bug"):
        tiny.run(torch.rand(1, 3, 32, 32))


def test_path_like_objects_load(tmp_path) -> None:
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    entry = next(e for e in __import__("os").scandir(tmp_path) if e.name == "m.pth")
    assert vitviz.load(entry, heads=2).spec.depth == 2  # os.DirEntry is os.PathLike
    assert vitviz.load(str(path).encode(), heads=2).spec.depth == 2


def test_softmax_written_straight_into_the_result_equals_a_hooked_copy(tiny, monkeypatch) -> None:
    """On the CPU in float32 each softmax writes into the result array itself; the maps equal plain hooks'."""
    from vitviz.core.running.capture import capture_attention

    x = torch.rand(3, 3, 32, 32)
    keep: list[torch.Tensor] = []
    with torch.inference_mode(), capture_attention(tiny.net, keep):
        tiny.net(x)
    direct, _ = tiny.forward_captured(x)
    np.testing.assert_array_equal(direct, torch.stack(keep, dim=1).numpy())
    probes = [m for m in tiny.net.modules() if isinstance(m, AttentionProbe)]
    assert all(p.target is None for p in probes)  # unbound again
    copies: list[int] = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: copies.append(1) or original(self, src, *a, **k))
    tiny.forward_captured(x)
    assert copies == []  # no layer was copied
    tiny.forward_captured(x, half=True)
    assert len(copies) == 2  # float16 storage: one cast-copy per layer


def test_rows_keep_only_those_queries(tiny) -> None:
    x = torch.rand(2, 3, 32, 32)
    full, logits = tiny.forward_captured(x)
    kept, same = tiny.forward_captured(x, rows=[0, 7])
    assert kept.shape == (2, 2, 2, 2, 19)
    np.testing.assert_array_equal(kept, full[:, :, :, [0, 7]])
    np.testing.assert_array_equal(same, logits)
    with pytest.raises(vitviz.VitvizError, match=r"rows \[19\]: expected token indices in 0..18"):
        tiny.forward_captured(x, rows=[19])


def test_negative_upto_counts_from_the_end(tiny) -> None:
    x = torch.rand(1, 3, 32, 32)
    np.testing.assert_array_equal(tiny.forward_captured(x, logits=False, upto=-1)[0],
                                  tiny.forward_captured(x, logits=False)[0])
    assert tiny.forward_captured(x, logits=False, upto=-2)[0].shape[1] == 1


def test_concurrent_runs_on_one_model_do_not_mix(tiny) -> None:
    """The capture hooks sit on the shared net; runs from several threads must each get their own maps."""
    from concurrent.futures import ThreadPoolExecutor

    xs = [torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    alone = [tiny.run(x).attentions for x in xs]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda x: tiny.run(x).attentions, xs * 3))
    for i, got in enumerate(together):
        np.testing.assert_array_equal(got, alone[i % 6])


def test_attention_only_pass_rejects_bad_layers(tiny) -> None:
    x = torch.rand(1, 3, 32, 32)
    with pytest.raises(vitviz.VitvizError, match="layer 2 out of range.*2 layers"):
        tiny.forward_captured(x, logits=False, upto=2)
    with pytest.raises(vitviz.VitvizError, match="logits=False"):
        tiny.forward_captured(x, upto=0)


def test_half_storage(tiny) -> None:
    x = torch.rand(1, 3, 32, 32)
    full, half = tiny.run(x), tiny.run(x, half=True)
    assert half.attentions.dtype == np.float16 and half.attentions.nbytes * 2 == full.attentions.nbytes
    np.testing.assert_allclose(half.attentions, full.attentions, atol=1e-3)


def test_other_resolution_non_square(tiny, tmp_path) -> None:
    Image.new("RGB", (120, 90), (200, 30, 30)).save(tmp_path / "red.jpg")
    r = tiny.run(tmp_path / "red.jpg", image_size=(40, 64))
    assert r.spec.grid == (5, 8) and r.attentions.shape[-1] == 3 + 40 and r.image.shape == (40, 64, 3)
    assert analysis.cls_attention(r, layer=-1).shape == (5, 8)
    assert tiny.spec.grid == (4, 4)  # the native spec is untouched


def test_pos_embed_resampled_and_similarity(tiny) -> None:
    native = tiny.pos_embed()
    assert native.shape == (3 + 16, 32)
    wide = tiny.pos_embed((4, 6))
    assert wide.shape == (3 + 24, 32)
    np.testing.assert_array_equal(wide[:3], native[:3])  # prefix rows are kept as they are
    sim = analysis.pos_embed_similarity(wide, (4, 6), num_prefix_in_pos=3)
    assert sim.shape == (4, 6, 4, 6)
    np.testing.assert_allclose(sim[1, 2, 1, 2], 1.0, atol=1e-6)


def test_no_embed_class_pos_embed_has_no_prefix_rows(tmp_path) -> None:
    timm = pytest.importorskip("timm")
    m = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=1,
                                                         num_heads=3, no_embed_class=True, reg_tokens=1)
    torch.save(m.state_dict(), tmp_path / "m.pth")
    vm = vitviz.load(tmp_path / "m.pth", device="cpu")
    assert vm.spec.pos_prefix == 0 and vm.pos_embed().shape == (16, 192)
    np.testing.assert_allclose(vm.pos_embed(), m.pos_embed[0].detach().numpy())


def test_rollout_on_real_capture_matches_naive(tiny) -> None:
    r = tiny.run(torch.rand(1, 3, 32, 32))
    fast = analysis.rollout(r, head_fusion="max", discard_ratio=0.5)
    np.testing.assert_allclose(fast, analysis.rollout_naive(r, head_fusion="max", discard_ratio=0.5), atol=1e-6)


def test_top_k_uses_labels(tmp_path) -> None:
    vm = vitviz.load(write_tiny_checkpoint(tmp_path / "m.pth"), heads=2, labels=list("abcde"), device="cpu")
    top = vm.run(torch.rand(1, 3, 32, 32)).top_k(3)
    assert len(top) == 3 and all(label in "abcde" for _, label, _ in top)
    assert top[0][2] >= top[1][2] >= top[2][2]


@pytest.mark.parametrize("mode", ["center", "squash", "squash_crop"])
def test_native_view_is_the_region_the_model_saw(tmp_path, tiny, mode) -> None:
    """Mark a square in the original; the model-input image and the native-resolution view agree on it."""
    from dataclasses import replace
    from vitviz.core.drawing.render import native_view
    arr = np.zeros((300, 500, 3), np.uint8)
    arr[100:200, 200:300] = 255  # a white square in the middle of a wide photo
    Image.fromarray(arr).save(tmp_path / "wide.png")
    tiny.spec = replace(tiny.spec, preprocess=replace(tiny.spec.preprocess, mode=mode))
    r = tiny.run(tmp_path / "wide.png")
    assert r.source_size == (300, 500)
    view = native_view(r)
    left, top, right, bottom = r.source_box
    assert view.shape[:2] == (round(bottom) - round(top), round(right) - round(left))
    small = np.asarray(Image.fromarray(view).resize((32, 32), Image.BILINEAR), dtype=float)
    assert np.abs(small - r.image.astype(float)).mean() < 12  # same content, up to resampling
    if mode == "center":  # shorter side 300 -> resize 35, crop 32: the model saw 300 * 32 / 35 px of it
        assert abs(view.shape[0] - 300 * 32 / 35) <= 1 and abs(view.shape[1] - view.shape[0]) <= 3  # integer resize


def test_a_guessed_label_list_is_a_quiet_note(tmp_path, capsys) -> None:
    """1000 classes and no names: the ImageNet names are assumed, but they never change attention, so they are a
    note (`spec.notes`, one short line in `vitviz info`), not a GuessWarning (issue 18: noise hides what matters)."""
    import warnings

    from _tiny import tiny_state_dict

    from vitviz.cli import main
    from vitviz.core.spec import GuessWarning

    torch.save(tiny_state_dict(num_classes=1000), tmp_path / "x.pth")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = vitviz.load(tmp_path / "x.pth", heads=2).spec
    assert not [w for w in caught if issubclass(w.category, GuessWarning) and "labels" in str(w.message)]
    assert "ImageNet" in dict(spec.notes)["labels"]
    assert main(["info", str(tmp_path / "x.pth"), "--heads", "2"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.strip().startswith("labels"))
    assert "1000" in line and "ImageNet" in line and len(line) < 200 and "GUESSED" not in line


def test_a_model_too_large_for_the_device_goes_back_and_says_so() -> None:
    """`runtime.move_module` (VitModel, LiveModel and the windowed models move through it): out of memory on the
    device, the module returns where it was and the DeviceError names what did not fit and what to do."""
    import torch

    from vitviz.core.running.runtime import move_module
    from vitviz.errors import DeviceError

    class Big(torch.nn.Linear):
        moves: list[object] = []

        def to(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            self.moves.append(args[0])
            if len(self.moves) == 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return self

    net, here = Big(2, 2), torch.device("cpu")
    with pytest.raises(DeviceError, match=r"big\.pth: 9\.0 M parameters do not fit on cpu \(CUDA out of memory "
                                          r"\(simulated\)\); use device='cpu'"):
        move_module(net, "cpu", here, "big.pth: 9.0 M parameters do not fit")
    assert net.moves == [torch.device("cpu"), here]                 # tried, then put back
    assert move_module(net, "cpu", here, "unused") == torch.device("cpu")


def test_a_plain_model_counts_its_parts_and_names_its_blocks(tiny) -> None:
    """Every part of the reference ViT is listed (an empty one too), the counts add up to the model's parameters,
    and a forward can be stopped before each block."""
    counts = tiny.parameter_counts()
    assert sum(counts.values()) == sum(p.numel() for p in tiny.net.parameters())
    assert set(counts) >= {"patch embedding", "position embedding", "blocks", "final norm", "head"}
    assert tiny.hook_points() == list(tiny.net.blocks)
