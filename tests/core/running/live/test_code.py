"""The ViT classes people write, opened through `--code` (issue 19): every layer's attention exact (1e-5) against
what the class's own code computes, and its logits (1e-4), with no grid= and no image_size= where the module and
its token count decide them.

The classes are in `live_classes_refs.py` (written fresh, in the styles of tutorial, course and training-code ViTs):
heads as modules, loops over heads, einsum, (B*H, T, T) bmm, nn.MultiheadAttention pre/post-norm and
sequence-first, nn.TransformerEncoder, SDPA with float and bool masks, 1-channel MNIST at 28 px (a patch Conv2d, a
loop over heads, patches cut in the forward), CIFAR at 32 px, a conv stem, registers, a distillation token,
token-0 pooling without a class token, the class token last, outputs as tuples, dicts, transformers outputs and
embeddings, Lightning-style wrappers with `self.model` and their checkpoints.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import vitviz
from vitviz.core.running.live import MHA, SDPA, SOFTMAX, LiveModel

REFS = Path(__file__).parents[3] / "live_classes_refs.py"
HEADWISE, FOLDED = f"{SOFTMAX} per head", f"{SOFTMAX} (B*H, T, T)"
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")  # guessed preprocessing, said

# name: (image size, grid, prefix names, heads, depth, channels, classes (0: features), mechanism)
CASES: dict[str, tuple[Any, ...]] = {
    "per_head": ((32, 32), (8, 8), ("cls",), 4, 2, 3, 10, HEADWISE),
    "mnist_loop_heads": ((28, 28), (4, 4), ("cls",), 4, 3, 1, 10, HEADWISE),
    "shared_loop": ((32, 32), (4, 4), ("cls",), 2, 3, 3, 6, HEADWISE),
    "einsum_unfold": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SOFTMAX),
    "bmm": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, FOLDED),
    "mnist_linear_patch": ((28, 28), (7, 7), ("cls",), 2, 2, 1, 10, SOFTMAX),
    "conv_stem": ((32, 32), (8, 8), (), 4, 2, 3, 10, SOFTMAX),
    "registers": ((32, 48), (4, 6), ("cls", "reg0", "reg1", "reg2", "reg3"), 4, 2, 3, 3, SOFTMAX),
    "distilled": ((32, 32), (4, 4), ("cls", "dist"), 2, 2, 3, 10, SOFTMAX),
    "class_token_last": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SOFTMAX),
    "tuple_output": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SOFTMAX),
    "features_first_tuple": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SOFTMAX),
    "dict_output": ((32, 32), (8, 8), ("cls",), 4, 2, 3, 10, HEADWISE),
    "hf_output": ((28, 28), (4, 4), ("cls",), 4, 3, 1, 10, HEADWISE),
    "embedding": ((32, 32), (4, 4), ("cls",), 2, 2, 3, 0, SOFTMAX),
    "projection": ((32, 32), (4, 4), ("cls",), 2, 2, 3, 0, SOFTMAX),
    "mha_pre_norm": ((32, 32), (8, 8), ("cls",), 4, 2, 3, 10, MHA),
    "mha_post_norm": ((28, 28), (4, 4), ("cls",), 4, 2, 1, 10, MHA),
    "torch_encoder": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, MHA),
    "torch_encoder_pre_norm": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, MHA),
    "sdpa_float_mask": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SDPA),
    "sdpa_bool_mask": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SDPA),
    "token0_no_cls": ((32, 32), (4, 4), (), 2, 3, 3, 10, SDPA),
    "lightning": ((32, 32), (8, 8), ("cls",), 4, 2, 3, 10, HEADWISE),
    "lightning_tuple": ((32, 32), (4, 4), ("cls",), 4, 2, 3, 10, SOFTMAX),
}
# How the weights of some are saved, as their users save them (the others: the weights their factory makes).
SAVED = {"lightning": "lightning", "lightning_tuple": "lightning", "mnist_loop_heads": "data_parallel",
         "per_head": "plain", "bmm": "plain"}


def _refs(model: LiveModel) -> Any:
    """The refs module as vitviz imported it (its RECORD and EAGER switches)."""
    return sys.modules[type(model.net).__module__]


def _own(model: LiveModel, x: torch.Tensor, eager: bool) -> tuple[list[torch.Tensor], Any]:
    """What the class's own code computes for `x`: every attention map it keeps (eager: SDPA and MHA written out)
    and its forward's result, outside any capture."""
    refs = _refs(model)
    refs.RECORD, refs.EAGER = [], eager
    training = model.net.training
    try:
        with torch.inference_mode():
            out = model.net.eval()(x)    # as vitviz runs it: eval mode (no dropout), its flags back afterwards
        return refs.RECORD, out
    finally:
        refs.RECORD, refs.EAGER = None, False
        model.net.train(training)


def _layers(record: list[torch.Tensor], heads: int) -> list[torch.Tensor]:
    """The recorded maps as (B, H, T, T) layers: single-head (B, T, T) maps stacked `heads` at a time."""
    layers, pending = [], []
    for m in record:
        if m.dim() == 4:
            layers.append(m)
            continue
        pending.append(m)
        if len(pending) == heads:
            layers.append(torch.stack(pending, dim=1))
            pending = []
    assert not pending
    return layers


def _scores(name: str, own: Any) -> torch.Tensor:
    """The class scores (or embedding) of a forward's result, as each class returns them."""
    if name == "features_first_tuple":
        return own[1]
    if name == "dict_output":
        return own["pred"]
    if name == "hf_output":
        return own.logits
    return own[0] if isinstance(own, tuple) else own


def _weights(name: str, tmp_path: Path) -> Path | None:
    """Save the factory's model (its LayerNorms moved, so loading the file shows) the way its users save it."""
    how = SAVED.get(name)
    if how is None:
        return None
    sys.path.insert(0, str(REFS.parent))
    try:
        import live_classes_refs as refs
    finally:
        sys.path.remove(str(REFS.parent))
    sd = getattr(refs, name)().state_dict()
    g = torch.Generator().manual_seed(99)
    sd = {k: v + torch.randn(v.shape, generator=g) * 0.05 if v.is_floating_point() else v for k, v in sd.items()}
    path = tmp_path / f"{name}.ckpt"
    if how == "lightning":      # a Lightning checkpoint: 'state_dict' of the wrapper ('model.' keys) and more
        torch.save({"epoch": 7, "global_step": 700, "pytorch-lightning_version": "2.4.0", "state_dict": sd,
                    "hyper_parameters": {"lr": 1e-3}, "optimizer_states": []}, path)
    elif how == "data_parallel":
        torch.save({"model": {f"module.{k}": v for k, v in sd.items()}, "epoch": 3}, path)
    else:
        torch.save(sd, path)
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_class_opens_through_its_code_exactly(name: str, tmp_path: Path) -> None:
    size, grid, prefix, heads, depth, chans, classes, mechanism = CASES[name]
    weights = _weights(name, tmp_path)
    model = vitviz.load(weights, code=f"{REFS}:{name}", device="cpu")
    s = model.spec
    assert isinstance(model, LiveModel) and s.family == "live"
    assert (s.image_size, s.grid, s.prefix_names, s.num_heads, s.depth, s.in_chans) == \
        (size, grid, prefix, heads, depth, chans)
    assert s.num_classes == classes
    assert [m for _, m in model.layers] == [mechanism] * depth
    if weights is not None:
        assert str(weights) in s.source_of("path") or "weights" in s.source_of("path")
    g = torch.Generator().manual_seed(3)
    for batch in (1, 2):     # two images: the heads per call and folded heads are told apart per image
        x = torch.randn(batch, chans, *size, generator=g)
        record, _ = _own(model, x, eager=True)
        reference = _layers(record, heads)
        _, own = _own(model, x, eager=False)
        attn, out = model.forward_captured(x)
        assert attn.shape == (batch, depth, heads, s.num_tokens, s.num_tokens)
        order = list(model.layout.order) if model.layout.order else list(range(s.num_tokens))
        assert len(reference) == depth
        for i, ref in enumerate(reference):
            ref = ref[..., order, :][..., order]       # the class token shown first wherever the model keeps it
            np.testing.assert_allclose(attn[:, i], ref.numpy(), atol=1e-5, rtol=0, err_msg=f"{name} layer {i}")
        np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
        expected = _scores(name, own)
        np.testing.assert_allclose(out, expected.float().numpy(), atol=1e-4, rtol=0, err_msg=f"{name} output")
        assert out.shape == (batch, classes or expected.shape[-1])


def test_what_the_outputs_are(tmp_path: Path) -> None:
    """Class scores wherever the forward returns them (a tuple's second element, a dict's 'pred', two heads
    averaged, a transformers output); an embedding (unit rows, a projection) is features, not 16 'classes'."""
    seen = {}
    for name in ("tuple_output", "features_first_tuple", "dict_output", "hf_output", "distilled", "embedding",
                 "projection", "lightning_tuple"):
        model = vitviz.load(None, code=f"{REFS}:{name}", device="cpu")
        seen[name] = (model.spec.num_classes, model.spec.source_of("num_classes"))
    assert seen["features_first_tuple"][0] == 10 and "output[1]" in seen["features_first_tuple"][1]
    assert seen["dict_output"][0] == 10 and "pred" in seen["dict_output"][1]
    assert seen["hf_output"][0] == 10 and "logits" in seen["hf_output"][1]
    assert seen["distilled"][0] == 10                 # (head(cls) + head_dist(dist)) / 2: no Linear's own output
    assert seen["embedding"][0] == 0 and "unit length" in seen["embedding"][1]
    assert seen["projection"][0] == 0 and "projection" in seen["projection"][1]
    labels = [f"c{i}" for i in range(16)]               # the user says they are 16 classes: then they are
    named = vitviz.load(None, code=f"{REFS}:projection", device="cpu", labels=labels)
    assert named.spec.num_classes == 16 and named.spec.labels == tuple(labels)
    result = vitviz.load(None, code=f"{REFS}:embedding", device="cpu").run(torch.randn(1, 3, 32, 32))
    assert result.logits.size == 0 and result.features is not None and result.features.shape == (16,)


def test_layouts_are_said() -> None:
    """Which layout each was read with is in the provenance: heads folded into the batch (checked on a batch of
    two), the class token found last by its image-independent score, the grid from 50 tokens at 28 px, the
    channels from a Linear over 1 x 4 x 4 pixels, the input size from the position table."""
    bmm = vitviz.load(None, code=f"{REFS}:bmm", device="cpu")
    assert "batch-major (b*H + h), checked on a batch of two" in bmm.spec.source_of("path")
    last = vitviz.load(None, code=f"{REFS}:class_token_last", device="cpu")
    assert last.layout.order == (16, *range(16)) and "last" in last.spec.source_of("token_order")
    mnist = vitviz.load(None, code=f"{REFS}:mnist_linear_patch", device="cpu")
    assert "50 tokens at 28x28 px = 7x7 patches of 4 px + 1 prefix" in mnist.spec.source_of("patch_size")
    assert "1 x 4 x 4 pixels" in mnist.spec.source_of("in_chans")
    loop = vitviz.load(None, code=f"{REFS}:mnist_loop_heads", device="cpu")
    assert "position table" in loop.spec.source_of("image_size") and loop.spec.kind_of("image_size") == "derived"
    shared = vitviz.load(None, code=f"{REFS}:shared_loop", device="cpu")
    assert [n for n, _ in shared.layers] == ["block.attn"] * 3      # one module, three layers
    heads = vitviz.load(None, code=f"{REFS}:per_head", device="cpu")
    assert [n for n, _ in heads.layers] == ["blocks.0.attn", "blocks.1.attn"]   # the module that holds the heads
    pos = last.pos_embed()
    table = last.net.pos_embed.detach()[0]
    np.testing.assert_array_equal(pos[0], table[16].numpy())            # the class token's row first, as its map


def test_cli_info_opens_them(capsys: pytest.CaptureFixture[str]) -> None:
    """`vitviz info --code` (the same load as `code=` above) on one class of each layout."""
    from vitviz.cli import main

    for name in ("per_head", "mnist_loop_heads", "bmm", "mnist_linear_patch", "conv_stem", "class_token_last",
                 "mha_post_norm", "lightning"):
        _size, grid, _prefix, heads, depth, *_rest = CASES[name]
        assert main(["info", "--code", f"{REFS}:{name}", "--json"]) == 0, name
        data = json.loads(capsys.readouterr().out)
        assert (data["grid"], data["num_heads"], len(data["attention_layers"])) == (list(grid), heads, depth), name


# ---------------------------------------------------------------------------------------------------------------
# user code that misbehaves: the library and the command line (the window: tests/gui/test_live_window.py)

BAD = Path(__file__).parents[3] / "misbehaving_code.py"
MISBEHAVES = {   # factory: what the error says
    "exits_in_forward": r"its forward failed on a probe input .*SystemExit.*sys\.exit\(\)",
    "interrupts_in_forward": r"its forward failed .*KeyboardInterrupt",
    "base_exception_in_forward": r"its forward failed .*Bare: the forward gave up",
    "exits_when_built": r"exits_when_built\(\) failed \(SystemExit: 3",
    "interrupts_when_built": r"interrupts_when_built\(\) failed \(KeyboardInterrupt",
}


@pytest.mark.parametrize("factory", list(MISBEHAVES))
def test_every_exception_of_user_code_is_a_user_code_error(factory: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main
    from vitviz.core.running.live import UserCodeError

    with pytest.raises(UserCodeError, match=MISBEHAVES[factory]):
        vitviz.load(None, code=f"{BAD}:{factory}", device="cpu")
    assert main(["info", "--code", f"{BAD}:{factory}"]) == 2          # never 0 with nothing printed
    captured = capsys.readouterr()
    assert captured.out == "" and "vitviz: error:" in captured.err and factory.split("_")[0][:4] in captured.err


def test_a_model_object_whose_forward_exits_is_a_user_code_error() -> None:
    """`vitviz.load(module)`: neither the reference conversion nor the live path lets its SystemExit escape."""
    from vitviz.core.running.live import UserCodeError

    sys.path.insert(0, str(BAD.parent))
    try:
        import misbehaving_code
    finally:
        sys.path.remove(str(BAD.parent))
    for factory in ("exits_in_forward", "interrupts_in_forward", "base_exception_in_forward"):
        with pytest.raises(UserCodeError, match="its forward failed .*Converting it to the reference ViT failed too"):
            vitviz.load(getattr(misbehaving_code, factory)())


def test_a_file_that_exits_on_import_and_a_forward_that_exits_later(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from vitviz.cli import main
    from vitviz.core.running.live import UserCodeError

    script = tmp_path / "train.py"      # a training script: argparse on import, a print
    script.write_text("import argparse\nprint('hello from train.py')\n"
                      "args = argparse.ArgumentParser().parse_args(['--epochs', '3'])\n"
                      "def build():\n    return None\n")
    with pytest.raises(UserCodeError, match=r"importing .*train\.py failed \(SystemExit: 2.*argparse"):
        vitviz.load(None, code=f"{script}:build")
    assert main(["info", "--code", f"{script}:build", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "hello from train.py" in captured.err   # its prints never mix into vitviz's output
    model = vitviz.load(None, code=f"{BAD}:exits_on_images", device="cpu")      # loads: its probes are fine
    picture = torch.rand(1, 3, 32, 32)
    with pytest.raises(UserCodeError, match=r"the model's own forward failed on input \(1, 3, 32, 32\) "
                                            r"\(SystemExit: 0"):
        model.forward_captured(picture)
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image)
    assert main(["export", "--code", f"{BAD}:exits_on_images", str(image), "--out", str(tmp_path / "out"),
                 "--quiet", "--device", "cpu"]) == 1                      # that image failed, said, and nothing more
    assert "SystemExit" in capsys.readouterr().err


def test_threads_left_by_user_code_do_not_keep_vitviz_info_running() -> None:
    import subprocess

    # The thread never ends by itself: `info` returning at all is the behaviour (the timeout only keeps a regression
    # from hanging the suite; it is no bound on how fast `info` is).
    done = subprocess.run([sys.executable, "-m", "vitviz", "info", "--code", f"{BAD}:leaves_a_thread"],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[4])
    assert done.returncode == 0, done.stderr
    assert "family: live" in done.stdout


def test_non_finite_weights_and_attention_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from vitviz.cli import main
    from vitviz.core.running.live import LiveModelError
    from vitviz.errors import NonFiniteError

    with pytest.raises(LiveModelError, match=r"NaN or infinite weights in qkv\.1\.weight \(1 of 768\), head\.bias"):
        vitviz.load(None, code=f"{BAD}:nan_weights", device="cpu")
    with pytest.raises(NonFiniteError, match=r"NaN or infinite attention for a probe input .* layer 0 .*head\(s\) 0, 1"):
        vitviz.load(None, code=f"{BAD}:nan_attention", device="cpu")
    for factory in ("nan_weights", "nan_attention"):
        assert main(["info", "--code", f"{BAD}:{factory}"]) == 2
        assert "NaN or infinite" in capsys.readouterr().err
    model = vitviz.load(None, code=f"{BAD}:nan_on_images", device="cpu")    # finite on its probes
    with pytest.raises(NonFiniteError, match=r"NaN or infinite attention for input \(1, 3, 32, 32\)"):
        model.run(torch.rand(1, 3, 32, 32))
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "out"
    assert main(["export", "--code", f"{BAD}:nan_on_images", str(image), "--out", str(out), "--quiet",
                 "--device", "cpu", "--npz"]) == 1
    assert "NaN or infinite attention" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"][0]["status"] == "failed" and not list(out.glob("*.png"))


def test_memory_meta_device_and_long_names_are_refused_clearly(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import resource

    from vitviz.cli import main
    from vitviz.core.running.live import LiveModelError, UserCodeError
    from vitviz.errors import DeviceError, VitvizError

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB
    with pytest.raises(DeviceError, match=r"a 60000x60000 probe input .* need .* nothing was allocated"):
        vitviz.load(None, code=f"{BAD}:tiny", device="cpu", image_size=60000)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < 1 << 20                       # refused, not allocated: the probe alone would take 43 GB
    assert main(["info", "--code", f"{BAD}:tiny", "--image-size", "60000"]) == 2
    assert "nothing was allocated" in capsys.readouterr().err
    with pytest.raises(LiveModelError, match=r"tensors are on the 'meta' device.*patch\.weight.*never loaded"):
        vitviz.load(None, code=f"{BAD}:on_meta", device="cpu")
    assert main(["info", "--code", f"{BAD}:on_meta"]) == 2 and "'meta' device" in capsys.readouterr().err
    weights = tmp_path / "tiny.pth"                      # a model built on the meta device gets the file's tensors
    sys.path.insert(0, str(BAD.parent))
    try:
        import misbehaving_code
    finally:
        sys.path.remove(str(BAD.parent))
    torch.save(misbehaving_code.tiny().state_dict(), weights)
    assigned = vitviz.load(weights, code=f"{BAD}:on_meta", device="cpu")
    assert "assigned to a model built on the meta device" in assigned.spec.source_of("path")
    long_code = tmp_path / ("m" * 300 + ".py")
    with pytest.raises(UserCodeError, match=r"the file name is too long for this system"):
        vitviz.load(None, code=f"{long_code}:build")
    assert main(["info", "--code", f"{long_code}:build"]) == 2
    assert "too long" in capsys.readouterr().err
    with pytest.raises(VitvizError, match="too long"):
        vitviz.load(tmp_path / ("w" * 300 + ".pth"), code=f"{BAD}:tiny")


def test_weights_that_do_not_fit_are_refused_naming_the_tensors(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main
    from vitviz.core.running.live import UserCodeError

    sys.path.insert(0, str(BAD.parent))
    try:
        import misbehaving_code
    finally:
        sys.path.remove(str(BAD.parent))
    sd = misbehaving_code.tiny().state_dict()
    quantized = {k: (v * 50).round().clamp(-127, 127).to(torch.int8) if k.endswith("weight") else v
                 for k, v in sd.items()}
    int8 = tmp_path / "int8.pth"
    torch.save(quantized, int8)
    with pytest.raises(UserCodeError, match=r"not floats where the model's are .*patch\.weight \(int8 into "
                                            r"float32\)"):
        vitviz.load(int8, code=f"{BAD}:tiny")
    partial = tmp_path / "partial.pth"
    torch.save({k: v for k, v in sd.items() if not k.startswith("qkv.1")}, partial)
    with pytest.raises(UserCodeError, match=r"the model's parameters not in the file: qkv\.1\.weight, qkv\.1\.bias"):
        vitviz.load(partial, code=f"{BAD}:tiny")
    for path, needle in ((int8, "int8 into float32"), (partial, "qkv.1.weight")):
        assert main(["info", str(path), "--code", f"{BAD}:tiny"]) == 2
        assert needle in capsys.readouterr().err


TRANSFORMERS_CODE = '''
from transformers import ViTConfig, ViTForImageClassification


def build():
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, num_labels=3)
    return ViTForImageClassification(config)
'''


def test_a_transformers_folder_loads_through_from_pretrained(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """transformers 5 saves older key names than its modules hold (`save_pretrained`: attention.attention.query
    for q_proj...): a strict match fails, the library's own from_pretrained route is taken and said."""
    from transformers import ViTConfig, ViTForImageClassification

    from vitviz.cli import main

    code = tmp_path / "hf_vit.py"
    code.write_text(TRANSFORMERS_CODE)
    torch.manual_seed(5)
    trained = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=64, num_labels=3))
    folder = tmp_path / "run"
    trained.save_pretrained(folder)
    model = vitviz.load(folder, code=f"{code}:build", device="cpu")
    assert "loaded by transformers' ViTForImageClassification.from_pretrained" in model.spec.source_of("path")
    assert "strict key match failed" in model.spec.source_of("path")
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        expected = trained.eval()(x).logits
    _, out = model.forward_captured(x)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=0)     # the folder's weights, not the factory's
    assert main(["info", str(folder), "--code", f"{code}:build"]) == 0
    assert "from_pretrained" in capsys.readouterr().out
