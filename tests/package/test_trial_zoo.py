"""The zoo sweep's harness (scripts/trial_zoo.py) classifies what it sees: a route whose attention is the
original's is exact, one whose attention is not (the original swapped for another with other weights) is wrong, a
said assumption makes a difference flagged, and a refusal is clear only when it names the model and a route. The
harness itself runs end to end on one model type in a subprocess (its cases are forked, capped processes) and
writes results.json and REPORT.md."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitviz.errors import CompositeModelError, VitvizError

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
_ENV_BEFORE = {k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE",
                           "TRANSFORMERS_VERBOSITY") if k in os.environ}
_spec = importlib.util.spec_from_file_location("trial_zoo", ROOT / "scripts" / "trial_zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def _maps(n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 5, 5, generator=g).softmax(-1) for _ in range(n)]


def test_compare_and_classify() -> None:
    ref = _maps()
    mine = [r[0].numpy() for r in ref]
    assert zoo.classify(zoo.compare(mine, ref), []) == "exact"
    # maps of another size (a text model's, a pooling query's) between the shown ones do not matter; one left out does
    extra = [ref[0], torch.rand(1, 2, 3, 3).softmax(-1), ref[1], ref[2]]
    assert zoo.classify(zoo.compare(mine, extra), []) == "exact"
    c = zoo.compare(mine[:2], ref)
    assert c["left_out"] == 1 and zoo.classify(c, []) == "wrong"
    bad = [m.copy() for m in mine]
    bad[1] = bad[1][:, ::-1].copy()           # one layer's heads swapped: not the model's attention
    c = zoo.compare(bad, ref)
    assert c["matched"] == 2 and c["worst"] > zoo.ATOL
    assert zoo.classify(c, []) == "wrong" and zoo.classify(c, ["assumed heads: a guess"]) == "flagged"
    other = [np.ones((2, 6, 6)) / 6]         # no map of the original has its size: wrong too
    assert zoo.classify(zoo.compare(other, ref), []) == "wrong"
    assert zoo.classify(zoo.compare(mine, []), []) == "unchecked" and zoo.classify(None, []) == "unchecked"


def test_classify_refusal() -> None:
    named = CompositeModelError("folder: transformers model_type 'qwen2_vl' (...); pass it to vitviz.load(module)")
    assert zoo.classify_refusal(named, ["qwen2_vl", "Qwen2VLForConditionalGeneration"]) == "refused-clear"
    assert zoo.classify_refusal(VitvizError("no patch embedding found"), ["qwen2_vl"]) == "refused-unclear"
    assert zoo.classify_refusal(VitvizError("qwen2_vl: not a ViT"), ["qwen2_vl"]) == "refused-unclear"  # no route
    assert zoo.classify_refusal(RuntimeError("qwen2_vl: use --code"), ["qwen2_vl"]) == "crash"
    assert zoo.classify_refusal(VitvizError("a bare state dict: pass code='F.py:make'"), []) == "refused-clear"


def test_recorder_sees_softmax_and_sdpa() -> None:
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    with zoo.Recorder() as rec:
        (q @ k.transpose(-2, -1)).softmax(-1)
        torch.nn.functional.scaled_dot_product_attention(q, k, torch.randn(1, 2, 4, 8))
        torch.softmax(torch.randn(3, 4), dim=0)              # not over the last dim of a >= 3-d tensor: ignored
    assert len(rec.maps) == 2
    torch.testing.assert_close(rec.maps[1], ((q @ k.transpose(-2, -1)) * 8 ** -0.5).softmax(-1))


def test_recorder_reads_the_weights_applied_to_the_values() -> None:
    """Talking heads change the softmax's output before it weights the values: the recorder reads what the original
    multiplies the values with (the left operand of that product), and a shown map equal to it matches."""
    g = torch.Generator().manual_seed(0)
    q, k, v, mix = (torch.randn(1, 2, 4, 8, generator=g), torch.randn(1, 2, 4, 8, generator=g),
                    torch.randn(1, 2, 4, 8, generator=g), torch.randn(2, 2, generator=g))
    with zoo.Recorder() as rec:
        p = (q @ k.transpose(-2, -1)).softmax(-1)
        w = torch.einsum("bhqk,gh->bgqk", p, mix)            # heads mixed after the softmax (talking heads)
        w @ v
    assert len(rec.maps) == 1
    torch.testing.assert_close(rec.applied[0], w)
    ref = list(zip(rec.maps, rec.applied))
    assert zoo.classify(zoo.compare([w[0].numpy()], ref), []) == "exact"
    assert zoo.classify(zoo.compare([p[0].numpy()], ref), []) == "exact"      # the softmax itself: also the model's
    assert zoo.classify(zoo.compare([(w[0] + 1e-2).numpy()], ref), []) == "wrong"


def test_joined_tokens_are_compared_on_their_grid() -> None:
    """CaiT's CLS joins at its class-attention layers: vitviz lays a self-attention map (N, N) in the lower right of
    the (N + 1) x (N + 1) grid and a class-attention row (1, N + 1) on top; the harness lays the original's maps the
    same way and compares every value, the zero rows included."""
    g = torch.Generator().manual_seed(1)
    self_attn = torch.rand(1, 2, 4, 4, generator=g).softmax(-1)
    cls_attn = torch.rand(1, 2, 1, 5, generator=g).softmax(-1)
    a, b = np.zeros((2, 5, 5), np.float32), np.zeros((2, 5, 5), np.float32)
    a[:, 1:, 1:], b[:, :1, :] = self_attn[0].numpy(), cls_attn[0].numpy()
    assert zoo.classify(zoo.compare([a, b], [self_attn, cls_attn]), []) == "exact"
    c = zoo.compare([a], [self_attn, cls_attn])                 # the class-attention layer not shown: left out
    assert c["left_out"] == 1 and zoo.classify(c, []) == "wrong"
    shifted = np.zeros_like(a)
    shifted[:, :4, :4] = self_attn[0].numpy()                  # the joining token placed last, not first
    assert zoo.classify(zoo.compare([shifted, b], [self_attn, cls_attn]), []) == "wrong"
    plain = [torch.rand(1, 2, 5, 5, generator=g).softmax(-1), torch.rand(1, 2, 1, 5, generator=g).softmax(-1)]
    # a ViT's own maps have no zero rows: a pooling query's map beside them is not counted as left out
    assert zoo.classify(zoo.compare([plain[0][0].numpy()], plain), []) == "exact"


def test_cait_live_is_exact_and_another_cait_is_wrong() -> None:
    """timm CaiT handed over live: the talking-heads weights and class-attention rows vitviz shows equal what
    timm's own code applies to the values; a CaiT of other weights as the reference is wrong."""
    timm = pytest.importorskip("timm")
    import vitviz

    def cait(seed: int):
        torch.manual_seed(seed)
        m = zoo.perturb(timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, patch_size=8, embed_dim=48,
                                          depth=2, num_heads=4, depth_token_only=2, num_classes=5), seed=seed)
        ref = zoo.copy.deepcopy(m)
        zoo._eager(ref)
        return m, ref

    model, ref = cait(0)
    names = ["Cait", "cait_xxs24_224"]
    got = zoo.run_route(lambda: vitviz.load(model, device="cpu"), ref, names)
    assert got["verdict"] == "exact" and got["matched"] == 4
    _, other = cait(7)
    assert zoo.run_route(lambda: vitviz.load(model, device="cpu"), other, names)["verdict"] == "wrong"


def test_backbone_outputs_stay_distinct_when_shrunk() -> None:
    """A ViT backbone's 4 outputs (DPT, Depth Anything) all became 'stage2' at 2 layers (transformers refuses
    duplicates, so 30 detection, depth and segmentation types were never built): its k outputs are its last k
    layers; a staged backbone (Swin, ResNet) keeps its stages and its outputs as they were."""
    plain = {"num_hidden_layers": 24, "out_features": ["stage6", "stage12", "stage18", "stage24"],
             "out_indices": [6, 12, 18, 24], "stage_names": ["stem"] + [f"stage{i}" for i in range(1, 25)]}
    got = zoo.shrink(plain)
    assert got["num_hidden_layers"] == 4 and got["out_features"] == ["stage1", "stage2", "stage3", "stage4"]
    assert got["out_indices"] == [1, 2, 3, 4] and got["stage_names"] == ["stem", "stage1", "stage2", "stage3", "stage4"]
    staged = {"depths": [2, 2, 6, 2], "num_layers": 4, "pretrained_window_sizes": [0, 0, 0, 0],
              "out_features": ["stage4"], "out_indices": [4]}
    got = zoo.shrink(staged)
    assert got["depths"] == [1, 1, 1, 1] and got["num_layers"] == 4 and got["pretrained_window_sizes"] == [0] * 4
    assert got["out_features"] == ["stage4"] and got["out_indices"] == [4]
    per_layer = {"num_hidden_layers": 6, "per_layer_config": {1: {"head_dim": 8}, 5: {"head_dim": 8}}}
    assert zoo.shrink(per_layer)["per_layer_config"] == {1: {"head_dim": 8}}


def test_counts_per_stage_are_not_shrunk_as_layer_indices(tmp_path: Path) -> None:
    """HGNetV2's `stage_numb_of_layers` (layers per stage, beside the other per-stage lists) was clipped like a list
    of layer indices to [1], so every HGNetV2-based model (D-FINE, DEIMv2, PP-DocLayout ...) failed to build: "All
    stage configuration lists must have the same length". A type out of scope is said so, not built."""
    small = zoo.shrink({"depths": [3, 4, 6, 3], "stage_numb_of_layers": [6, 6, 6, 6], "stage_kernel_size": [3, 3, 5, 5],
                        "num_hidden_layers": 12, "out_indices": [1, 2]})
    assert small["stage_numb_of_layers"] == [6, 6, 6, 6] and small["depths"] == [1, 1, 1, 1]
    assert zoo.shrink({"num_hidden_layers": 12, "fullatt_block_indexes": [7, 11]})["fullatt_block_indexes"] == [1]
    got = zoo.run_hf("vibevoice_asr", "VibeVoiceAsrForConditionalGeneration", tmp_path)
    assert got["status"] == "out of scope" and "audio only" in got["error"]


def test_naflex_reference_is_made_as_its_processor_makes_it() -> None:
    """SigLIP 2 (NaFlex) takes patches, a mask and their grid, not an image: the harness called it on the image
    and left it unchecked. It cuts the image with transformers' own convert_image_to_patches, and vitviz's maps
    match the ones the original computes on them."""
    import vitviz

    cfg = transformers.Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, patch_size=8, num_patches=16)
    torch.manual_seed(0)
    model = zoo.perturb(transformers.Siglip2VisionModel(cfg))
    zoo._eager(model)
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(2))
    ref = zoo.reference_maps(model, x)
    assert len(ref) == 2 and ref[0][0].shape == (1, 4, 24, 24)       # two layers over 4 x 6 patches
    names = ["Siglip2VisionModel", "siglip2_vision_model"]
    assert zoo.run_route(lambda: vitviz.load(model, device="cpu"), model, names)["verdict"] == "exact"


def _qwen2_5_tower() -> torch.nn.Module:
    """A tiny Qwen2.5-VL vision tower: 4 px patches, 2 x 2 merge blocks, windows of 2 x 2 blocks in block 0."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    cfg = qwen.Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
                                      spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                                      fullatt_block_indexes=[1], out_hidden_size=32)
    torch.manual_seed(0)
    tower = zoo.perturb(qwen.Qwen2_5_VisionTransformerPretrainedModel(cfg))
    zoo._eager(tower)
    return tower


def test_packed_tower_is_checked_and_a_wrong_order_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Qwen-VL-style tower takes packed patches and grid_thw, not an image: the harness left it unchecked. It
    calls the tower with the image packed as vitviz packs it, records its eager softmaxes itself (a windowed
    block's windows on the diagonal) and places its tokens by the packing and the tower's own window reordering:
    vitviz's maps are exact, and maps shown without the window reordering taken back are wrong."""
    import vitviz
    from vitviz.core.running.live.packing import PackedTower

    tower = _qwen2_5_tower()
    assert zoo.packed_tower_of(torch.nn.Sequential(tower)) is tower
    ref = zoo.reference_maps(tower, torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(2)))
    assert [r[0].shape for r in ref] == [(1, 4, 96, 96)] * 2
    assert (ref[0][0] == 0).float().mean() > 0.5 and (ref[1][0] == 0).sum() == 0      # windows, then full attention
    names = ["Qwen2_5_VisionTransformerPretrainedModel"]
    route = zoo.run_route(lambda: vitviz.load(tower, device="cpu", image_size=(32, 48)), tower, names)
    assert route["verdict"] == "exact" and route["matched"] == 2
    monkeypatch.setattr(PackedTower, "_window_position", lambda self, rows, cols: None)
    route = zoo.run_route(lambda: vitviz.load(tower, device="cpu", image_size=(32, 48)), tower, names)
    assert route["verdict"] == "wrong" and route["worst"] > zoo.ATOL


def _paddleocr_tower() -> torch.nn.Module:
    """A tiny PaddleOCR-VL vision tower: 4 px patches taken in raster order as `pixel_values` (1, T, C, p, p), 2-D
    rotary positions on q and k, merged by 2 x 2 only after its blocks."""
    cfg = transformers.PaddleOCRVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, patch_size=4, spatial_merge_size=2, image_size=32)
    torch.manual_seed(0)
    tower = zoo.perturb(transformers.PaddleOCRVisionModel(cfg))
    zoo._eager(tower)
    return tower


def test_raster_tower_is_checked_and_a_wrong_order_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """A raster-order tower takes its patches row by row as `pixel_values` with grid_thw, not an image: the harness
    left it unchecked. It calls the tower with the image packed as vitviz packs it, records its eager softmaxes and
    places its tokens by where the packing put their pixels: vitviz's maps are exact; maps placed as if the tower
    took merge blocks (the Qwen-VL order) are wrong, and so are maps of patches fed in merge blocks."""
    import vitviz
    from vitviz.core.running.live.packing import PackedTower

    tower = _paddleocr_tower()
    assert zoo.packed_tower_of(torch.nn.Sequential(tower)) is tower
    ref = zoo.reference_maps(tower, torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(2)))
    assert [r[0].shape for r in ref] == [(1, 4, 96, 96)] * 2
    names = ["PaddleOCRVisionModel"]

    def route() -> dict:
        return zoo.run_route(lambda: vitviz.load(tower, device="cpu", image_size=(32, 48)), tower, names)

    got = route()
    assert got["verdict"] == "exact" and got["matched"] == 2
    blocks = torch.arange(96).reshape(4, 2, 6, 2).permute(0, 2, 1, 3).reshape(-1)     # merge blocks, row by row
    monkeypatch.setattr(PackedTower, "order", lambda self, size: tuple(int(i) for i in blocks))
    got = route()
    assert got["verdict"] == "wrong" and got["worst"] > zoo.ATOL
    monkeypatch.undo()
    pack = PackedTower.pack

    def in_blocks(self: PackedTower, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        patches, grid = pack(self, image)
        return patches[:, blocks], grid

    monkeypatch.setattr(PackedTower, "pack", in_blocks)
    got = route()
    assert got["verdict"] == "wrong" and got["worst"] > zoo.ATOL


def test_original_refusing_vitviz_size_is_run_at_it(tmp_path: Path) -> None:
    """A bare timm Swin state dict states no size: vitviz runs it at 224 px, which the original built at 64 px
    refuses, so the route was unchecked. The original is set to 224 px by timm's own set_input_size, each stage's
    windows kept, and compared (said in the route); an original of other weights at that size is wrong."""
    import timm as timm_lib

    import vitviz

    def swin(seed: int) -> torch.nn.Module:
        torch.manual_seed(0)
        model = timm_lib.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=64, embed_dim=16,
                                      depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), window_size=4, num_classes=5)
        return zoo.perturb(model, seed=seed)

    model = swin(0)
    bare = tmp_path / "swin.pth"
    torch.save(model.state_dict(), bare)
    resized = zoo.resized_original(model, (224, 224))
    assert [tuple(st.blocks[0].window_size) for st in resized.layers] == \
        [tuple(st.blocks[0].window_size) for st in model.layers]
    route = zoo.run_route(lambda: vitviz.load(str(bare), device="cpu"), model, [])
    assert route["verdict"] == "exact" and "set_input_size" in route["reference"]
    route = zoo.run_route(lambda: vitviz.load(str(bare), device="cpu"), swin(9), [])
    assert route["verdict"] in ("wrong", "flagged") and route["worst"] > zoo.ATOL
    assert zoo.resized_original(torch.nn.Linear(2, 2), (224, 224)) is None


def test_routes_exact_and_a_wrong_original_is_wrong(tmp_path: Path) -> None:
    """A tiny transformers ViT by file and live is exact; compared with a copy of other weights, it is wrong."""
    import vitviz

    model = zoo.build_hf("vit", "ViTForImageClassification")
    model.save_pretrained(tmp_path)
    names = ["vit", "ViTForImageClassification"]
    assert zoo.run_route(lambda: vitviz.load(str(tmp_path), device="cpu"), model, names)["verdict"] == "exact"
    assert zoo.run_route(lambda: vitviz.load(model, device="cpu"), model, names)["verdict"] == "exact"
    other = zoo.perturb(zoo.build_hf("vit", "ViTForImageClassification"), seed=9)
    got = zoo.run_route(lambda: vitviz.load(str(tmp_path), device="cpu"), other, names)
    assert got["verdict"] == "wrong" and got["worst"] > zoo.ATOL


def test_sweep_end_to_end(tmp_path: Path) -> None:
    """The harness on one transformers type (vit) and one timm architecture: results.json and REPORT.md."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "trial_zoo.py"), "--only", "vit,vit_small_patch16_224",
                    "--out", str(tmp_path), "--workers", "2"], check=True, env=env, cwd=ROOT,
                   capture_output=True, text=True)
    cases = json.loads((tmp_path / "results.json").read_text())["cases"]
    assert set(cases) == {"hf:vit", "timm:vit_small_patch16_224"}
    assert {r: v["verdict"] for r, v in cases["hf:vit"]["routes"].items()} == {"file": "exact", "live": "exact"}
    timm_routes = cases["timm:vit_small_patch16_224"]["routes"]
    assert timm_routes["hub"]["verdict"] == "exact" and timm_routes["live"]["verdict"] == "exact"
    report = (tmp_path / "REPORT.md").read_text()
    assert "| transformers by file (save_pretrained folder), 1 | 1 |" in report


def test_importing_the_harness_changes_no_environment() -> None:
    """The harness set HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE at import: collecting this file made every later hub
    test of the session run offline. It sets them for its own run only."""
    assert all(os.environ.get(key) != value or key in _ENV_BEFORE for key, value in zoo.QUIET_OFFLINE.items())
