"""`vitviz.core.reading.objects`: what a model object states beside its tensors; a library's classes are read by
its family module (`read_object` / `object_config`), torch's own here."""
from __future__ import annotations

import inspect

import pytest
import torch

from vitviz.core.reading import objects
from vitviz.core.reading.families import timm as timm_family, torchvision as tv_family
from vitviz.errors import VitvizError


def test_a_librarys_object_reading_lives_in_its_family() -> None:
    source = inspect.getsource(objects)
    assert '"timm.' not in source and '"torchvision.' not in source     # no library's class tested by name here
    assert callable(timm_family.read_object) and callable(timm_family.object_config)
    assert callable(tv_family.read_object)


def test_timm_objects_state_pooling_norm_order_and_config() -> None:
    from timm.models.vision_transformer import VisionTransformer

    net = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3,
                            global_pool="avg")
    said = objects.module_settings(net)
    assert said["pooling"][0] == "avg" and "global_pool 'avg'" in said["pooling"][1]
    assert said["block_norm"] == ("pre", "model object: VisionTransformer's blocks are pre-norm by their class")
    assert timm_family.object_config(torch.nn.Linear(2, 2)) is None
    with pytest.raises(VitvizError, match="pool_include_prefix"):
        timm_family.read_object(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                                  global_pool="max", pool_include_prefix=True), "V")


def test_torchvision_blocks_are_pre_norm_and_others_say_nothing() -> None:
    from torchvision.models.vision_transformer import VisionTransformer

    net = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)
    assert tv_family.read_object(net, "V") == {"block_norm": ("pre", "model object: V's blocks are pre-norm by "
                                                                     "their class")}
    assert tv_family.read_object(torch.nn.Linear(2, 2), "L") == {} == timm_family.read_object(torch.nn.Linear(2, 2),
                                                                                               "L")
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, norm_first=False)
    assert objects.module_settings(torch.nn.TransformerEncoder(layer, 1))["block_norm"][0] == "post"   # torch's own
