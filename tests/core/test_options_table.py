"""One `Option` record per override (`vitviz.core.options.OPTIONS`): the command line, the checks, the routes'
keyword lists, HOW_TO_PASS and NUMERIC_FIELDS are all made from it, and a value set on a route that does not take
it is refused, never ignored."""
from __future__ import annotations

import argparse
import math
import re
import warnings

import pytest
import torch
from torch import nn

import vitviz
from vitviz.core import options
from vitviz.core.reading import validate
from vitviz.core.reading.families import FAMILY_NAMES
from vitviz.errors import OverrideError
from tests._tiny import tiny_state_dict


def _parser() -> argparse.ArgumentParser:
    from vitviz.cli.options import add_override_arguments

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    return parser


def test_every_option_is_checked_and_every_flag_is_the_records() -> None:
    from vitviz.cli import options as cli

    actions = {a.dest: a for a in _parser()._actions if a.option_strings}
    for o in options.OPTIONS:
        assert o.value in validate.VALUE_CHECKS or o.value == "family", o.name
        if not o.cli_flag:
            assert o.name not in actions, o.name
            continue
        a = actions[o.name]
        assert a.option_strings == [o.cli_flag] and o.help and str(a.help).startswith(o.help), o.name
        if o.value == "choice":
            assert tuple(a.choices) == o.offered and set(o.offered) <= set(o.choices), o.name
        else:
            assert a.type is cli._CLI_TYPES[o.value] and a.choices is None, o.name
    flags = {a.dest for a in _parser()._actions if a.option_strings} - {"help", "verbose", "quiet"}
    assert flags == {o.name for o in options.OPTIONS if o.cli_flag} == set(cli.override_names())


# a value of the wrong kind for each kind of value: the check refuses it, naming the override
WRONG = {"heads": 2.5, "family": "no_such_family", "size": "big", "number": -1.0, "stats": "grey",
         "positive_stats": (0.0, 0.0, 0.0), "choice": "no_such_choice", "labels": 3, "text": 3, "device": 3,
         "resize": 10 ** 6, "count": -1, "bool": "yes", "channels": 100}


@pytest.mark.parametrize("option", [o for o in options.OPTIONS if o.value in WRONG], ids=lambda o: o.name)
def test_each_override_is_checked_by_its_record(option: options.Option) -> None:
    with pytest.raises(OverrideError, match=rf"^override {option.name} "):
        validate.check_overrides({option.name: WRONG[option.value]}, FAMILY_NAMES)


def test_checks_follow_the_records_bounds_and_choices() -> None:
    out = validate.check_overrides({"eps": 1e-5, "attn_scale": 0.0, "num_prefix": 0, "act": "swiglu",
                                    "pooling": "map", "rope": "pe", "image_size": "64"}, FAMILY_NAMES)
    assert out == {"eps": 1e-5, "attn_scale": 0.0, "num_prefix": 0, "act": "swiglu", "pooling": "map",
                   "rope": "pe", "image_size": (64, 64)}
    with pytest.raises(OverrideError, match="override eps 0"):      # eps: low open (0, 1]
        validate.check_overrides({"eps": 0.0}, FAMILY_NAMES)
    with pytest.raises(OverrideError, match="override rope 'dino'"):     # a preset name, checked at the door
        validate.check_overrides({"rope": "dino"}, FAMILY_NAMES)
    # the command line offers fewer than the API takes: a gated MLP and a MAP head are read off the file
    with pytest.raises(SystemExit):
        _parser().parse_args(["--act", "swiglu"])


def test_route_lists_are_derived() -> None:
    from vitviz.core.reading.hyperparams import OVERRIDES
    from vitviz.core.running.live import LIVE_OVERRIDES
    from vitviz.core.running.winload import APPLIES, WINDOW_OVERRIDES

    assert LIVE_OVERRIDES == ("code", "grid", "num_prefix", "in_chans", "live")
    assert WINDOW_OVERRIDES == ("window", "global_blocks")
    assert set(OVERRIDES) | set(LIVE_OVERRIDES) | set(WINDOW_OVERRIDES) == set(options.OPTION)
    assert not set(OVERRIDES) & (set(LIVE_OVERRIDES) | set(WINDOW_OVERRIDES))
    assert "block_norm" not in APPLIES and {"heads", "act", "pos_interp", "crop_mode"} <= set(APPLIES)


def test_how_to_pass_names_real_flags_and_keywords() -> None:
    flags = {s for a in _parser()._actions for s in a.option_strings}
    for field, how in options.HOW_TO_PASS.items():
        for flag in re.findall(r"--[a-z][a-z-]*", how):
            assert flag in flags, (field, flag)
        for keyword in re.findall(r"\b([a-z_]+)=", how):
            assert keyword in options.OPTION, (field, keyword)
    assert options.HOW_TO_PASS["preprocess"] == "mean=M and std=S (CLI --mean M --std S)"
    assert options.HOW_TO_PASS["mlp_kind"].startswith("act='gelu'|") and "--act gelu|" in options.HOW_TO_PASS[
        "mlp_kind"]
    # every field whose guess changes the numbers says how to answer it
    assert set(options.NUMERIC_FIELDS) <= set(options.HOW_TO_PASS)
    assert {"num_heads", "mlp_kind", "block_norm", "attn_scale", "eps", "token_order"} <= set(options.NUMERIC_FIELDS)
    assert "preprocess" not in options.NUMERIC_FIELDS and "labels" not in options.NUMERIC_FIELDS


def test_a_warning_says_the_records_way_to_pass_it(tmp_path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "m.pth")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        vitviz.load(tmp_path / "m.pth", heads=4)
    text = " ".join(str(w.message) for w in seen)
    assert options.HOW_TO_PASS["block_norm"] in text and options.HOW_TO_PASS["attn_scale"] in text


def test_a_bad_record_is_refused() -> None:
    with pytest.raises(ValueError, match="value 'float'"):
        options.Option("x", "float")
    with pytest.raises(ValueError, match="choices"):
        options.Option("x", "choice")
    with pytest.raises(ValueError, match="routes"):
        options.Option("x", "text", routes=("gpu",))
    with pytest.raises(ValueError, match="names the spec field"):
        options.Option("x", "text", remembered=True)


def test_remembered_answers_and_shown_settings_are_derived_from_the_records() -> None:
    """The answers store, the window's question dialog and its Model settings list what the records say, and the
    provenance each shows is the record's field (one name per thing: no hand copy to forget)."""
    from vitviz.catalog import answers
    from vitviz.core.spec import ModelSpec

    remembered = tuple(o.name for o in options.OPTIONS if o.remembered)
    assert remembered == options.REMEMBERABLE == answers.REMEMBERED == tuple(answers.CHECKS)
    assert set(remembered) == {"heads", "block_norm", "act", "attn_scale"}      # the four the window asks
    shown = options.setting_fields()
    assert shown["heads"] == "num_heads" and shown["act"] == "mlp_kind" and shown["crop_mode"] == "preprocess"
    assert set(remembered) <= set(shown)
    spec_fields = set(ModelSpec.__dataclass_fields__)
    assert set(shown.values()) <= spec_fields, "a shown setting names a field the spec does not have"


def test_a_new_remembered_option_appears_in_the_store_and_the_settings() -> None:
    """An Option marked remembered and shown is remembered and shown: nothing else lists it."""
    new = options.Option("eps", "number", bounds=(0.0, 1.0), fields=("eps",), remembered=True, setting="Eps")
    records = (*options.OPTIONS, new)
    assert options.remembered_options(records)[-1] == "eps"
    assert options.setting_fields(records)["eps"] == "eps"
    plain = options.Option("eps", "number", fields=("eps",))
    assert "eps" not in options.remembered_options((*options.OPTIONS, plain))
    assert "eps" not in options.setting_fields((*options.OPTIONS, plain))


def test_remembered_answers_follow_the_records_value_kind(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A number answer is stored as a float, a choice as it is; a bad value is refused naming the store."""
    from vitviz.catalog import answers

    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path / "answers.json"))
    answers.remember("m.pth", {"attn_scale": 1, "act": "relu", "heads": 4})
    assert answers.answers_for("m.pth") == {"attn_scale": 1.0, "act": "relu", "heads": 4}
    assert isinstance(answers.answers_for("m.pth")["attn_scale"], float)
    with pytest.raises(OverrideError, match="act"):
        answers.remember("m.pth", {"act": "swish"})


# ------------------------------------------------------------------------------------- never ignored in silence

class _OwnCode(nn.Module):
    """A model no layout converts: it runs live."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t, _ = self.attn(t, t, t)
        return self.head(t.mean(1))


def test_structure_overrides_are_refused_on_the_live_path() -> None:
    """Its own code computes its blocks: act= or attn_scale= would be ignored, so they are refused, naming them."""
    with pytest.raises(OverrideError, match=r"act= \(CLI --act\), block_norm= \(CLI --block-norm\) do not apply to a model run from its own code"):
        vitviz.load(_OwnCode(), act="relu", block_norm="post")
    with pytest.raises(OverrideError, match=r"attn_scale= \(CLI --attn-scale\) does not apply .*it takes heads, image_size"):
        vitviz.load(_OwnCode(), live=True, attn_scale=1.0)
    model = vitviz.load(_OwnCode(), image_size=32, mean=(0.5,) * 3, std=(0.5,) * 3)   # what it takes still works
    assert model.spec.family == "live" and model.spec.preprocess.mean == (0.5, 0.5, 0.5)


def test_window_overrides_are_refused_for_a_plain_vit(tmp_path) -> None:
    torch.save(tiny_state_dict(), tmp_path / "m.pth")
    with pytest.raises(OverrideError, match=r"window= \(CLI --window\) does not apply to a plain ViT"):
        vitviz.load(tmp_path / "m.pth", heads=4, window=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isclose(vitviz.load(tmp_path / "m.pth", heads=4, eps=1e-5).spec.eps, 1e-5)


def test_remembered_reference_answers_stay_out_of_a_code_load(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.catalog import answers
    from vitviz.cli.options import with_remembered

    monkeypatch.setattr(answers, "answers_for", lambda path: {"heads": 4, "block_norm": "post"})
    assert with_remembered("w.pth", {}, quiet=True) == {"heads": 4, "block_norm": "post",
                                                         "_remembered": frozenset({"heads", "block_norm"})}
    assert with_remembered("w.pth", {"code": "m.py:build"}, quiet=True) == {"code": "m.py:build", "heads": 4,
                                                                            "_remembered": frozenset({"heads"})}
    assert with_remembered("w.pth", {"heads": 2, "block_norm": "pre"}, quiet=True) == {"heads": 2,
                                                                                        "block_norm": "pre"}


def test_a_windowed_models_guessed_heads_says_to_pass_heads(tmp_path) -> None:
    """A windowed spec names the head count `heads` (a plain ViT's `num_heads`): its guess warning, and the window's
    line for it, still say heads=N (CLI --heads N), not 'a config.json naming the model'."""
    timm = pytest.importorskip("timm")
    sam = _tiny_sam(timm)
    torch.save(sam.state_dict(), tmp_path / "sam.pth")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = vitviz.load(tmp_path / "sam.pth", device="cpu", window=2, global_blocks=(1,))
    assert "heads" in dict(model.spec.guesses)
    said = [str(w.message) for w in seen if ": heads is a guess" in str(w.message)]
    assert said and said[0].endswith("pass heads=N (CLI --heads N)"), said
    assert dict(model.described_assumptions())["heads"].endswith("pass heads=N (CLI --heads N)")   # the window's


def _tiny_sam(timm):
    torch.manual_seed(0)
    return timm.create_model("samvit_base_patch16", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                            depth=2, num_heads=2, global_attn_indexes=[1], window_size=2, neck_chans=8,
                             num_classes=0, use_rel_pos=False)



def test_live_only_overrides_ask_for_the_live_path() -> None:
    """grid=, num_prefix= and in_chans= mean the module's own code: a module that converts runs live with them
    (in_chans= was dropped in silence on the converted model), a file refuses them naming the live path."""
    timm = pytest.importorskip("timm")
    module = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                           num_classes=3).eval()
    assert vitviz.load(module).spec.family != "live"
    assert vitviz.load(module, in_chans=3).spec.family == "live"
    with pytest.raises(vitviz.VitvizError, match=r"in_chans= applies to the live path"):
        vitviz.load(tiny_state_dict(), in_chans=3)


def test_each_surface_words_advice_its_own_way() -> None:
    """Round five: the command line and the window said "pass act='relu'" and "(pass pooling='avg')", Python's
    words. One parser (`options.reword_advice`) finds the advice of a library message; the command line names the
    flag, the window the control that sets it (or the flag to start it with)."""
    from vitviz.core.options import cli_wording
    from vitviz.core.options import reword_advice
    from vitviz.gui.assumptions import window_wording

    act = "guess: GELU (pass act='relu' if the MLP uses ReLU)"
    assert cli_wording(act) == "guess: GELU (pass --act relu if the MLP uses ReLU)"
    assert window_wording(act) == "guess: GELU (answer Activation: relu in Review assumptions… if the MLP uses ReLU)"
    size = "pass image_size=(h, w) if the model was trained non-square"
    assert cli_wording(size).startswith("pass --image-size HxW if")
    assert window_wording(size).startswith("set Model settings › Image size to HxW if")
    assert window_wording("(pass pooling='avg')") == "(start vitviz with --pooling avg)"
    both = "pass mean=M and std=S (CLI --mean M --std S)"
    assert cli_wording(both) == "pass --mean M --std S"
    assert window_wording(both) == "set Model settings › Mean to M and set Model settings › Std to S"
    other = "timm's pass global_pool=avg"                    # not an override of vitviz: left as it is
    assert cli_wording(other) == other and window_wording(other) == other
    seen = []
    assert reword_advice("x pass heads=4; y", lambda o, v: seen.append((o.name, v)) or "Z") == "x Z; y"
    assert seen == [("heads", "4")]
