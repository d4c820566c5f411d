"""Verification in bounded memory (issue 36): `verify` runs the original and vitviz's model in step, comparing
layer by layer, so it never holds either model's full attention stack: every original hands its maps over as it
computes them (timm, transformers' modules its `output_attentions` reads, a composite tower run by its transformers
code, open_clip, torchvision, the user's code; a windowed original block by block).

Every map either model computes is watched through a weak reference: the original's as its run gives them (one by
one, or as a list at the end, were a run to return one), vitviz's as its softmax probes give them (a
capture that writes into one (B, L, H, T, T) array is counted as that whole array; a live model's capture sink as
its whole array), and each layer the comparison receives. At every such event the bytes of maps still alive are
summed, in layers of the map just seen. Holding both stacks is 2 x DEPTH layers; one stack DEPTH.
"""
from __future__ import annotations

import functools
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import vitviz
from vitviz.core.analyses import verify as verify_module
from vitviz.core.running import capture as capture_module
from vitviz.core.running.model import AttentionProbe

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
DEPTH, HEADS = 8, 2


class _Watch:
    """Weak references to every attention map alive, and the most layers' bytes alive at once (either thread)."""

    def __init__(self) -> None:
        self.maps: dict[int, weakref.ref] = {}
        self.worst = 0.0   # the most bytes of maps alive at once, in layers of the map sampled
        self.samples = 0
        self.lock = threading.Lock()

    def add(self, array: Any) -> None:
        with self.lock:
            self.maps[id(array)] = weakref.ref(array)

    def sample(self, seen: Any) -> None:
        layer = int(torch.as_tensor(seen.shape[-3:]).prod()) * 4   # (H, T, T) float32
        with self.lock:
            alive = [r() for r in self.maps.values()]
            memory = dict(_memory(a) for a in alive if a is not None)   # one count per memory block
            held = sum(memory.values())
            self.worst = max(self.worst, held / layer)
            self.samples += 1

    def seen(self, array: Any) -> None:
        base = getattr(array, "_base", None)
        self.add(base if base is not None else array)   # a view of a capture's whole array: the array
        self.sample(array)


def _memory(array: Any) -> tuple[int, int]:
    """(address, bytes) of the memory an array or tensor lives in (a detached tensor, its NumPy view and the
    tensor share one)."""
    if isinstance(array, torch.Tensor):
        return array.untyped_storage().data_ptr(), array.untyped_storage().nbytes()
    return array.__array_interface__["data"][0], array.nbytes


def _watched(monkeypatch: pytest.MonkeyPatch, model: Any) -> _Watch:
    watch = _Watch()

    class Counted(verify_module._Original):
        """The original, its maps watched as its run gives them (one by one, or all at the end)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            run = self.run

            def counted(size: tuple[int, int], x: torch.Tensor, each: Any) -> Any:
                def handed(m: Any) -> None:
                    watch.seen(m)
                    each(m)
                maps, out = run(size, x, handed)
                for m in maps:
                    watch.add(m)
                if maps:
                    watch.sample(maps[0])
                return maps, out
            self.run = counted

    sink_append = capture_module.LayerSink.append

    def sink(self: Any, layer: torch.Tensor) -> None:   # a capture's whole (B, L, H, T, T) array, once made
        sink_append(self, layer)
        watch.seen(self.array[:, 0])

    compare_append = verify_module._LayerByLayer.append

    def compared(self: Any, layer: torch.Tensor) -> None:   # each layer of vitviz's as the comparison gets it
        watch.seen(layer)
        compare_append(self, layer)

    monkeypatch.setattr(verify_module, "_Original", Counted)
    monkeypatch.setattr(capture_module.LayerSink, "append", sink)
    monkeypatch.setattr(verify_module._LayerByLayer, "append", compared)
    for m in model.net.modules():
        if isinstance(m, AttentionProbe):
            m.register_forward_hook(lambda _m, _i, out: watch.seen(out))
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


def _live_folder(tmp_path: Path) -> Path:
    """A Pixtral vision tower: vitviz runs it live by its transformers code, and verify builds transformers' own."""
    torch.manual_seed(0)
    config = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=DEPTH,
                                              num_attention_heads=HEADS, image_size=32, patch_size=4, head_dim=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.PixtralVisionModel(config).eval().save_pretrained(tmp_path / "pixtral")
    return tmp_path / "pixtral"


def _windowed_live_folder(tmp_path: Path) -> Path:
    """A Qwen2.5-VL model's vision tower (packed patches, blocks of windows and of full attention, a one-layer text
    model beside it): vitviz runs the tower live by its transformers code, verify builds transformers' own, each of
    its layers made of one call per window."""
    torch.manual_seed(0)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=100,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]})
    vision = dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_heads=HEADS, depth=DEPTH,
                  hidden_size=32, intermediate_size=64, window_size=24, fullatt_block_indexes=[1, 5],
                  out_hidden_size=32)
    whole = transformers.Qwen2_5_VLForConditionalGeneration(
        transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole.eval().save_pretrained(tmp_path / "qwen2_5_vl")
    return tmp_path / "qwen2_5_vl"


# (folder, the most layers alive at once): an original that hands its maps over as it computes them (timm's;
# transformers', read at its attention modules; a tower run by its transformers code, each layer as its next one
# begins, a windowed layer's windows gathered first) holds a few layers in flight; both stacks are 2 x DEPTH layers
CASES = {"timm": (_timm_folder, 4), "transformers": (_transformers_folder, 4),
         "live": (_live_folder, 4), "live-windowed": (_windowed_live_folder, 4)}


@pytest.mark.parametrize("case", list(CASES))
def test_verify_never_holds_both_full_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    make, most = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(make(tmp_path), device="cpu", **({"image_size": (32, 48)} if "windowed" in case else {}))
    assert (model.spec.family == "live") == case.startswith("live")
    watch = _watched(monkeypatch, model)
    check = verify_module.verify(model)
    assert check.verified, check.summary()
    assert len(check.sizes) == 2 and all(len(layers) == DEPTH for layers in check.per_layer)
    assert watch.samples >= 2 * DEPTH + 2   # every layer of vitviz's and the original's maps, at both sizes
    assert watch.worst <= most + 1e-9, f"{watch.worst:.1f} layers of attention alive at once (at most {most})"
    assert watch.worst >= (DEPTH if most > DEPTH else 1)   # the measurement sees a whole stack where one is held


def _original_nets(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    built: list[torch.nn.Module] = []
    make = verify_module._built

    def kept(*a: Any, **k: Any) -> torch.nn.Module:
        built.append(make(*a, **k))
        return built[-1]

    monkeypatch.setattr(verify_module, "_built", kept)
    return built


def test_the_original_holds_no_second_copy_of_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file tensor equal to one vitviz's model holds is that tensor in the original (storage shared): the
    weights are held once while both run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(_timm_folder(tmp_path), device="cpu")
    built = _original_nets(monkeypatch)
    assert verify_module.verify(model).verified
    mine = {t.untyped_storage().data_ptr() for t in model.net.state_dict().values()}
    theirs = built[0].state_dict()
    alone = [k for k, t in theirs.items() if t.untyped_storage().data_ptr() not in mine]
    assert not alone and len(theirs) == len(model.net.state_dict()), f"held twice: {alone}"


def test_a_weight_vitviz_changed_does_not_reach_the_original(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage is shared only where the file's tensor equals vitviz's element for element: a weight of vitviz's
    model that no longer equals the file's is not the original's, whose tensor stays the file's, and the check
    says 'differs'."""
    folder = _timm_folder(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(folder, device="cpu")
    qkv = model.net.blocks[1].attn.qkv.weight
    with torch.no_grad():
        qkv[0, 1] += 0.5   # not a value the fingerprint samples: only the equality check tells
    built = _original_nets(monkeypatch)
    check = verify_module.verify(model)
    assert check.verdict == verify_module.DIFFERS and check.first_differing_layer == 1, check.summary()
    from safetensors.torch import load_file

    file_qkv = load_file(str(folder / "model.safetensors"))["blocks.1.attn.qkv.weight"]
    theirs = built[0].state_dict()["blocks.1.attn.qkv.weight"]
    assert torch.equal(theirs, file_qkv) and theirs.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()


def _hf_folder(tmp_path: Path, kind: str) -> Path:
    """A tiny transformers ViT (classifier), DINOv2 or CLIP vision tower with random weights, saved as a folder
    ('vit-bf16': the ViT saved in bfloat16)."""
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=HEADS, intermediate_size=64, image_size=32,
                 patch_size=8)
    net = {"vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**shape, num_labels=3)),
           "dinov2": lambda: transformers.Dinov2Model(transformers.Dinov2Config(**shape)),
           "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**shape))}[kind.split("-")[0]]()
    if kind.endswith("-bf16"):   # saved in bfloat16: vitviz and the original both run it in float32
        net = net.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.eval().save_pretrained(tmp_path / kind)
    return tmp_path / kind


def _hf_originals(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """The transformers originals verify builds (through `towers.from_tensors`, its loader of the file's tensors)."""
    from vitviz.core.reading import towers

    built: list[torch.nn.Module] = []
    make = towers.from_tensors

    def kept(*a: Any, **k: Any) -> Any:
        net, info = make(*a, **k)
        built.append(net)
        return net, info

    monkeypatch.setattr(towers, "from_tensors", kept)
    return built


@pytest.mark.parametrize("kind", ["vit", "dinov2", "clip", "vit-bf16"])
def test_a_transformers_original_holds_no_second_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       kind: str) -> None:
    """transformers' original is given the file's tensors sharing vitviz's storage, its separate query, key and
    value weights as row blocks of vitviz's fused qkv and its class / position tables as views of vitviz's (a
    bfloat16 file's as the float32 both run in): every tensor it holds lives in memory vitviz's model already
    holds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(_hf_folder(tmp_path, kind), device="cpu")
    built = _hf_originals(monkeypatch)
    assert verify_module.verify(model).verified
    mine = {t.untyped_storage().data_ptr() for t in model.net.state_dict().values()}
    theirs = built[0].state_dict()
    alone = [k for k, t in theirs.items() if t.untyped_storage().data_ptr() not in mine]
    assert not alone, f"held twice: {alone}"
    assert sum(1 for k in theirs if k.endswith(("q_proj.weight", "query.weight"))) == 3   # the fused ones, too


def test_a_weight_vitviz_changed_does_not_reach_a_transformers_original(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A query weight vitviz's fused qkv no longer holds as the file does is not shared: transformers' original
    keeps the file's own (its storage not vitviz's), and the check says 'differs' from that layer."""
    folder = _hf_folder(tmp_path, "vit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(folder, device="cpu")
    qkv = model.net.blocks[1].attn.qkv.weight
    with torch.no_grad():
        qkv[0, 1] += 0.5   # not a value the fingerprint samples: only the equality check tells
    built = _hf_originals(monkeypatch)
    check = verify_module.verify(model)
    assert check.verdict == verify_module.DIFFERS and check.first_differing_layer == 1, check.summary()
    from safetensors.torch import load_file

    file_query = load_file(str(folder / "model.safetensors"))["vit.encoder.layer.1.attention.attention.query.weight"]
    theirs = built[0].state_dict()
    queries = [t for t in theirs.values() if t.shape == file_query.shape and torch.equal(t, file_query)]
    assert queries and all(t.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr() for t in queries)
    assert not any(t.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr() and
                   torch.equal(t, qkv[: file_query.shape[0]]) for t in theirs.values())


def test_a_transformers_original_hands_each_layer_over_as_it_computes_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' original is never asked for its whole stack (`output_attentions`, as an argument or in its
    config): each layer's weights are handed over while that layer runs, before the next one starts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(_transformers_folder(tmp_path), device="cpu")
    from transformers.models.vit import modeling_vit

    started = [0]     # the original's encoder layers begun so far (its own thread)
    handed: list[int] = []   # at each layer handed over: how many had begun
    asked: list[Any] = []    # output_attentions as each forward of the original was asked (argument, config)
    forward = transformers.ViTForImageClassification.forward

    @functools.wraps(forward)   # (its signature kept: verify reads which arguments it takes)
    def spied(self: Any, *a: Any, **k: Any) -> Any:
        asked.append((k.get("output_attentions"), self.config.output_attentions))
        started[0] = 0
        return forward(self, *a, **k)

    def begun(module: torch.nn.Module, _args: Any) -> None:
        if isinstance(module, modeling_vit.ViTLayer):
            started[0] += 1

    class Spied(verify_module._Original):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            run = self.run

            def spying(size: tuple[int, int], x: torch.Tensor, each: Any) -> Any:
                def given(m: Any) -> None:
                    handed.append(started[0])
                    each(m)
                maps, out = run(size, x, given)
                assert not maps   # nothing kept for the end
                return maps, out
            self.run = spying

    monkeypatch.setattr(transformers.ViTForImageClassification, "forward", spied)
    monkeypatch.setattr(verify_module, "_Original", Spied)
    hook = torch.nn.modules.module.register_module_forward_pre_hook(begun)
    try:
        check = verify_module.verify(model)
    finally:
        hook.remove()
    assert check.verified and len(check.sizes) == 2, check.summary()
    assert asked == [(None, False)] * 2, asked
    assert handed == list(range(1, DEPTH + 1)) * 2, handed


def test_a_whole_clip_is_verified_without_its_text_tower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole transformers CLIP file: the original is transformers' own vision side
    (`CLIPVisionModelWithProjection`, its image projection compared), built from the vision config with the vision
    tensors only: no text module is built."""
    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=HEADS, intermediate_size=64,
                  image_size=32, patch_size=8)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
                bos_token_id=0, eos_token_id=1)
    whole = transformers.CLIPModel(transformers.CLIPConfig(vision_config=vision, text_config=text, projection_dim=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole.eval().save_pretrained(tmp_path / "clip")
        model = vitviz.load(tmp_path / "clip", device="cpu")
    built = _hf_originals(monkeypatch)
    check = verify_module.verify(model)
    assert check.verified and check.max_output is not None, check.summary()
    assert [type(net).__name__ for net in built] == ["CLIPVisionModelWithProjection"]
    text_modules = [name for net in built for name, m in net.named_modules() if "Text" in type(m).__name__]
    assert not text_modules, text_modules
    assert "its text tower not built" in check.original


def _windowed_folder(tmp_path: Path, kind: str) -> Path:
    """A tiny transformers Swin, Swin v2, SAM image encoder or ViTDet of DEPTH blocks, saved as a folder."""
    torch.manual_seed(0)
    swin = dict(image_size=64, patch_size=4, embed_dim=16, depths=[DEPTH // 2] * 2, num_heads=[1, 2], window_size=4)
    net = {"swin": lambda: transformers.SwinForImageClassification(transformers.SwinConfig(**swin, num_labels=3)),
           "swinv2": lambda: transformers.Swinv2Model(transformers.Swinv2Config(**swin)),
           "sam": lambda: transformers.SamVisionModel(transformers.SamVisionConfig(
               hidden_size=32, num_hidden_layers=DEPTH, num_attention_heads=HEADS, image_size=64, patch_size=8,
               window_size=3, output_channels=16, global_attn_indexes=[1, 3, 5, 7], mlp_dim=64)),
           "vitdet": lambda: transformers.VitDetModel(transformers.VitDetConfig(
               hidden_size=32, num_hidden_layers=DEPTH, num_attention_heads=HEADS, image_size=40, patch_size=8,
               window_size=2, window_block_indices=[0, 2, 4, 6]))}[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.eval().save_pretrained(tmp_path / kind)
    return tmp_path / kind


@pytest.mark.parametrize("kind", ["swin", "swinv2", "sam", "vitdet"])
def test_a_windowed_transformers_original_holds_no_stack_of_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   kind: str) -> None:
    """A windowed transformers original is not asked for the `output_attentions` that collects every block's
    weights to the end (Swin, SAM: their attention modules return them at each call anyway), or, where its modules
    return them only when asked (Swin v2, ViTDet), each block's are let go once handed over: the weights its
    attention modules return (watched as they return them, before verify's own hooks) are alive for at most two
    blocks at once, while vitviz's blocks are compared."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(_windowed_folder(tmp_path, kind), device="cpu")
    alive: list[weakref.ref] = []
    worst = [0]

    def returned(module: torch.nn.Module, _i: Any, out: Any) -> None:   # (global hooks run before a module's own)
        if type(module).__name__ in verify_module._HF_ATTENTION and isinstance(out, tuple) and len(out) > 1 \
                and isinstance(out[1], torch.Tensor):
            alive.append(weakref.ref(out[1]))

    compare_append = verify_module._LayerByLayer.append

    def compared(self: Any, layer: torch.Tensor) -> None:
        compare_append(self, layer)
        worst[0] = max(worst[0], sum(r() is not None for r in alive))

    monkeypatch.setattr(verify_module._LayerByLayer, "append", compared)
    hook = torch.nn.modules.module.register_module_forward_hook(returned)
    try:
        check = verify_module.verify(model, sizes=[model.spec.image_size[0]])
    finally:
        hook.remove()
    assert check.verified and [len(layers) for layers in check.per_layer] == [DEPTH], check.summary()
    assert len(alive) >= DEPTH   # every block's weights were seen as its module returned them
    assert worst[0] <= (3 if kind == "swin" else 2), f"{worst[0]} blocks' weights of the original alive at once"
