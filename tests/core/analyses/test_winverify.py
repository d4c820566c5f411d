"""`verify` of windowed models (Swin): the original is built from the file by the library its config names (a timm
hub folder, a transformers folder), its own softmax read block by block and compared with vitviz's windowed maps
at the native size and native + 2 patches per side; a wrong conversion differs from the block it breaks; a file no
config names stays unverified, saying why."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.analyses.verify import DIFFERS, UNNAMED_UNVERIFIED, UNVERIFIED, VERIFIED

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
DEPTHS, HEADS = (2, 2), (1, 2)   # 2 stages of 2 blocks: block 1 and block 3 shifted


def _load(path: Path) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, device="cpu")


def timm_folder(tmp_path: Path, v2: bool) -> Path:
    from timm.models import save_for_hf

    kw = dict(img_size=64, embed_dim=16, depths=DEPTHS, num_heads=HEADS, window_size=4, num_classes=5)
    torch.manual_seed(0)
    model = perturb(timm.create_model("swinv2_tiny_window8_256" if v2 else "swin_tiny_patch4_window7_224",
                                      pretrained=False, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(tmp_path), safe_serialization=True, model_args=kw)
    return tmp_path


def hf_folder(tmp_path: Path, v2: bool) -> Path:
    from transformers import SwinConfig, SwinForImageClassification, Swinv2Config, Swinv2Model

    c = dict(image_size=64, patch_size=4, embed_dim=16, depths=list(DEPTHS), num_heads=list(HEADS), window_size=4)
    torch.manual_seed(0)
    model = perturb(Swinv2Model(Swinv2Config(**c)) if v2 else SwinForImageClassification(SwinConfig(**c,
                                                                                                     num_labels=3)))
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("make, library", [(timm_folder, "timm"), (hf_folder, "transformers")])
def test_a_swin_folder_is_verified_block_by_block(tmp_path: Path, make, library: str, v2: bool) -> None:
    vm = _load(make(tmp_path, v2))
    check = vitviz.verify(vm)
    assert check.verdict == VERIFIED, check.summary() + " " + check.reason
    assert check.library == library and check.summary().startswith(f"Verified against {library} ")
    assert check.sizes == ((64, 64), (72, 72)) and not check.skipped
    assert [len(layers) for layers in check.per_layer] == [4, 4]   # every block at both sizes
    assert check.max_attention <= 1e-5 and check.max_output <= 1e-4
    assert check.to_dict()["verdict"] == "verified"


@pytest.mark.parametrize("make", [timm_folder, hf_folder])
def test_a_dropped_shift_differs_from_the_first_shifted_block(tmp_path: Path, make) -> None:
    """vitviz's model made wrong (the shifts of its spec dropped): the comparison finds it at block 1."""
    vm = _load(make(tmp_path, False))
    vm.spec = dataclasses.replace(vm.spec, shifts=((0, 0),) * len(vm.spec.shifts))
    check = vitviz.verify(vm)
    assert check.verdict == DIFFERS and check.first_differing_layer == 1
    assert check.per_layer[0][0][1] <= 1e-5 and check.per_layer[0][1][1] > 1e-3
    assert check.summary().startswith("Differs from the original from layer 1")


def test_a_wrong_weight_differs_from_its_block(tmp_path: Path) -> None:
    vm = _load(timm_folder(tmp_path, True))
    with torch.no_grad():
        vm.net.all_blocks()[2].attn.qkv.weight[0, 0] += 0.5   # stage 1's first block's first query row
    check = vitviz.verify(vm, sizes=[64])
    assert check.verdict == DIFFERS and check.first_differing_layer == 2 and check.sizes == ((64, 64),)
    assert all(d <= 1e-5 for _, d in check.per_layer[0][:2])


def test_a_bare_swin_state_dict_is_unverified_saying_why(tmp_path: Path) -> None:
    folder = timm_folder(tmp_path / "hub", False)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=64, embed_dim=16,
                              depths=DEPTHS, num_heads=HEADS, window_size=4, num_classes=5)
    from safetensors.torch import load_file

    model.load_state_dict(load_file(folder / "model.safetensors"))
    torch.save(model.state_dict(), tmp_path / "swin.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vm = vitviz.load(tmp_path / "swin.pth", image_size=64, device="cpu")
    check = vitviz.verify(vm)
    assert check.verdict == UNVERIFIED and check.reason == UNNAMED_UNVERIFIED
    assert "nothing names this file's architecture" in check.summary()


def test_the_original_is_compared_one_block_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of vitviz's blocks is compared as its softmax is done, while the original has handed over at most
    that block: neither side's stack of blocks is collected."""
    from vitviz.core.analyses import verify as verify_module

    vm = _load(timm_folder(tmp_path, False))
    seen: list[tuple[int, int]] = []
    append = verify_module._LayerByLayer.append

    def watched(self, layer: torch.Tensor) -> None:
        append(self, layer)
        seen.append((len(self.rows), self.theirs.taken))
        assert self.theirs.maps.qsize() <= 1   # the original waits for its next block to be taken

    monkeypatch.setattr(verify_module._LayerByLayer, "append", watched)
    check = vitviz.verify(vm, sizes=[64])
    assert check.verified and seen == [(i, i) for i in range(1, 5)]


SAM_ARGS = dict(img_size=64, patch_size=8, embed_dim=32, depth=4, num_heads=2, global_attn_indexes=[1, 3],
                window_size=3, neck_chans=16, num_classes=0)


def timm_sam_folder(tmp_path: Path) -> Path:
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = perturb(timm.create_model("samvit_base_patch16", pretrained=False, **SAM_ARGS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(tmp_path), safe_serialization=True, model_args=SAM_ARGS)
    return tmp_path


def hf_sam_folder(tmp_path: Path) -> Path:
    from transformers import SamVisionConfig, SamVisionModel

    torch.manual_seed(0)
    model = perturb(SamVisionModel(SamVisionConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                                   image_size=64, patch_size=8, window_size=3, output_channels=16,
                                                   global_attn_indexes=[1, 3], mlp_dim=128)))
    model.save_pretrained(tmp_path)
    return tmp_path


def test_a_timm_sam_folder_is_verified_at_both_sizes_and_a_wrong_global_block_differs(tmp_path: Path) -> None:
    vm = _load(timm_sam_folder(tmp_path))
    check = vitviz.verify(vm)
    assert check.verdict == VERIFIED and check.library == "timm", check.reason
    assert check.sizes == ((64, 64), (80, 80)) and [len(layers) for layers in check.per_layer] == [4, 4]
    with torch.no_grad():
        vm.net.all_blocks()[1].attn.qkv.weight[0, 0] += 0.5   # the first global block
    wrong = vitviz.verify(vm, sizes=[64])
    assert wrong.verdict == DIFFERS and wrong.first_differing_layer == 1


def test_a_transformers_sam_folder_is_verified_at_the_size_it_takes(tmp_path: Path) -> None:
    """transformers' SAM refuses any size but its own: that size is skipped, with its error, not passed over."""
    vm = _load(hf_sam_folder(tmp_path))
    check = vitviz.verify(vm)
    assert check.verdict == VERIFIED and check.library == "transformers", check.reason
    assert check.sizes == ((64, 64),) and [len(layers) for layers in check.per_layer] == [4]
    assert check.skipped and check.skipped[0][0] == (80, 80) and "cannot run at 80x80" in check.skipped[0][1]
    norm = next(m for m in vm.net.all_blocks()[0].modules() if isinstance(m, torch.nn.LayerNorm))
    norm.eps = 1.0   # a wrong setting, not a weight (eps 1e-6): the first block differs
    assert vitviz.verify(vm, sizes=[64]).first_differing_layer == 0


def test_an_against_it_cannot_honour_is_said_not_ignored(tmp_path: Path) -> None:
    vm = _load(timm_folder(tmp_path, False))
    assert vitviz.verify(vm, against="timm").verified
    other = vitviz.verify(vm, against="transformers")
    assert other.verdict == UNVERIFIED and "named by timm" in other.reason
    arch = vitviz.verify(vm, against="timm:swin_tiny_patch4_window7_224")
    assert arch.verdict == UNVERIFIED and "not yet with an architecture" in arch.reason


def test_a_torchvision_swin_file_under_its_release_name_is_verified(tmp_path: Path) -> None:
    """swin_t itself (its release name names it; random weights): torchvision's `F.softmax` calls read on the
    original's thread, every block at 224 and 232 px."""
    import torchvision

    torch.manual_seed(0)
    torch.save(perturb(torchvision.models.swin_t()).state_dict(), tmp_path / "swin_t-704ceda3.pth")
    check = vitviz.verify(_load(tmp_path / "swin_t-704ceda3.pth"))
    assert check.verdict == VERIFIED and check.library == "torchvision", check.reason
    assert check.sizes == ((224, 224), (232, 232)) and [len(layers) for layers in check.per_layer] == [12, 12]


def test_torchvision_swin_files_not_the_release_their_name_says_differ_and_bare_ones_are_unverified(
        tmp_path: Path) -> None:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    tiny = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=list(DEPTHS), num_heads=list(HEADS),
                           window_size=[4, 4], num_classes=5)
    torch.save(tiny.state_dict(), tmp_path / "swin_t-704ceda3.pth")
    named = vitviz.verify(_load(tmp_path / "swin_t-704ceda3.pth"))
    assert named.verdict == DIFFERS and "do not fit torchvision.models.swin_t()" in named.reason
    torch.save(tiny.state_dict(), tmp_path / "swin.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = vitviz.verify(vitviz.load(tmp_path / "swin.pth", image_size=64, device="cpu"))
    assert bare.verdict == UNVERIFIED and bare.reason == UNNAMED_UNVERIFIED


@pytest.mark.parametrize("backbone", [False, True])
def test_a_transformers_vitdet_folder_is_verified_and_a_wrong_table_differs(tmp_path: Path, backbone: bool) -> None:
    from transformers import VitDetBackbone, VitDetConfig, VitDetModel

    cfg = VitDetConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=40, patch_size=8,
                       window_size=2, window_block_indices=[0, 2], use_relative_position_embeddings=True,
                       pretrain_image_size=32, **({"out_features": ["stage3"]} if backbone else {}))
    torch.manual_seed(0)
    perturb((VitDetBackbone if backbone else VitDetModel)(cfg)).save_pretrained(tmp_path)
    vm = _load(tmp_path)
    check = vitviz.verify(vm)
    assert check.verdict == VERIFIED and check.library == "transformers", check.reason
    assert check.sizes == ((40, 40), (56, 56)) and [len(layers) for layers in check.per_layer] == [3, 3]
    with torch.no_grad():
        # one entry of block 0's decomposed table (a shift of the whole table is the same for every key: the
        # softmax does not see it)
        next(p for n, p in vm.net.named_parameters() if "rel_pos_h" in n)[0, 0] += 0.5
    assert vitviz.verify(vm, sizes=[40]).first_differing_layer == 0
