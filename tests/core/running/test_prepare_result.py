"""An earlier result given to `run` (`ImageModel.prepare`): the image run once more -- the window's intervened run of
an image it has run clean -- takes that result's input again instead of decoding and resizing the file again, with
the same attention, logits, display image and source; at another size the source is read anew."""
from __future__ import annotations

import warnings

import numpy as np

import vitviz
from vitviz.core.running.interventions import Ablate
from vitviz.demo import demo_checkpoint, demo_images


def test_a_result_runs_again_as_its_image_does() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(demo_checkpoint(), device="cpu")
    path = str(demo_images()[0])
    clean = model.run(path)
    for intervene in (None, Ablate([(0, 1)])):
        again, fresh = model.run(clean, intervene=intervene), model.run(path, intervene=intervene)
        np.testing.assert_array_equal(again.attentions, fresh.attentions)
        np.testing.assert_array_equal(again.logits, fresh.logits)
        np.testing.assert_array_equal(again.input, fresh.input)
        np.testing.assert_array_equal(again.image, fresh.image)
        assert (again.source, again.source_box, again.source_size) == (fresh.source, fresh.source_box,
                                                                       fresh.source_size)
        assert again.interventions == fresh.interventions
        assert not np.shares_memory(again.input, clean.input)        # a copy: the clean result is never touched
    p = model.spec.patch_size
    size = (model.spec.image_size[0] + p, model.spec.image_size[1] + p)
    other = model.run(clean, image_size=size)                        # another size: the file read anew
    np.testing.assert_array_equal(other.attentions, model.run(path, image_size=size).attentions)
    assert other.input.shape[-2:] == size and other.source == path


def test_a_result_of_another_recipe_is_read_anew() -> None:
    """A result made with another preprocessing recipe (another model's mean and std) holds an input this model
    would not make: its source is read anew, not its input taken as this model's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(demo_checkpoint(), device="cpu")
        other = vitviz.load(demo_checkpoint(), device="cpu", mean=(0.1, 0.2, 0.3), std=(0.2, 0.3, 0.4))
    assert other.spec.preprocess != model.spec.preprocess
    path = str(demo_images()[0])
    theirs = other.run(path)
    again, fresh = model.run(theirs), model.run(path)
    assert not np.array_equal(theirs.input, fresh.input)
    np.testing.assert_array_equal(again.input, fresh.input)
    np.testing.assert_array_equal(again.attentions, fresh.attentions)
