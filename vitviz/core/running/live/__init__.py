"""The live-module path: run the user's own `nn.Module` unchanged and capture the attention its code computes.

    model = vitviz.load(my_vit, live=True)     # any nn.Module -> LiveModel (a Model: run, forward_captured...)
    result = model.run("cat.jpg")               # AttentionResult with (L, H, T, T) attentions, as for a file
    model.layers                                # [('blocks.0.attn', 'scaled_dot_product_attention'), ...]

For models a checkpoint file cannot describe, the user has the model's code. Attention is seen where that code
computes it, by one `TorchFunctionMode` (thread-local: other threads running the same module are not affected):

- `nn.MultiheadAttention` (`F.multi_head_attention_forward`): per-head weights. A caller that asks for weights gets
  them computed per head (averaged afterwards when it asked for the average, as torch does); a caller that passes
  `need_weights=False` keeps its own SDPA path and output, and the probabilities are recomputed from the q and k that
  path hands to SDPA (when this torch's code cannot be followed, the weights are forced instead).
- `F.scaled_dot_product_attention`: the module gets its own SDPA output; `softmax(q k^T * scale + mask)` is
  recomputed in float32 from the same q, k, mask (bool or float), scale, `is_causal` and `enable_gqa`.
- an explicit softmax over the last axis of a 4-D (B, H, T, T) score tensor (`F.softmax`, `torch.softmax`,
  `Tensor.softmax`, `nn.Softmax`): its own output is copied; one head's (B, T, T) or 2-D (T, T) maps (a module
  per head, loops over heads and images, as the from-scratch tutorials write it) are grouped into layers by the
  frame that computes them, and maps that cannot be told apart by layer are refused, saying what to pass; scores
  whose two token axes are not the last two, with the softmax over one of them (labml's sequence-first
  (T_q, T_k, B, H) and `softmax(dim=1)`), are read with their axes moved to (B, H, T_q, T_k), the softmax's axis
  as the keys.

Where a module changes its softmax's output before the product with the values (CaiT's talking heads mix the
heads' probabilities by a Linear), the weights that meet the values are shown, said; a random change (dropout in
training mode) or a constant factor leaves the softmax shown, said. Class-attention layers whose few queries join
late ((H, 1, N + 1): CaiT's CLS over [CLS, patches]) are laid on one (N + 1) x (N + 1) grid with the self-attention
layers before them (`AttentionLayout.joined`). Attention computed inside windows ((B, H, windows, q, k): Hiera's
mask units) is never folded into heads: a Hiera (and DaViT's window blocks) is shown per stage (`stages.py`),
anything else refused by name.

The mode also turns off PyTorch's fused `TransformerEncoderLayer` / `MultiheadAttention` fast paths for the captured
forward only (they check for torch-function overrides and step aside), so attention computed there is seen too.
Which mechanism found which layer is reported (`LiveModel.layers`); a forward in which no attention is seen raises
`NoAttentionError` saying what was tried. The layer's module is read from the call stack when attention is found
(no hook on every module, so the forward pass runs at full speed). The mode (and the probe's hooks) are installed in
a context manager and removed in `finally`; the model runs in eval mode for the capture and gets its own train/eval
flags back afterwards.

Tokens, grid and prefix count come from the patch embedding (a Conv2d whose stride equals its kernel, or a
Rearrange/Unfold of patches followed by a Linear) and the attention's T, measured on one probe forward pass at
load; `grid=`, `num_prefix=`, `image_size=`, `mean=`/`std=` override them.

`--code FILE.py:FACTORY` (`load_code`) imports a user's file and calls its factory: that runs the file's code, so it
only happens when the user asks for it; the weights file itself is read with `weights_only=True`, never executed.
A model with Lazy modules (nn.LazyLinear, nn.LazyConv2d: the d2l book's ViT) is given its shapes by one dry forward
of a probe input before weights are loaded or it is described (`describe.materialise_lazy`), as torch asks.

The package, lowest first (each imports only those above it):

    errors.py     LiveModelError, NoAttentionError, UserCodeError; user_call, through which the user's code runs
    packing.py    PackedTower: a tower taking packed patches + grid_thw (Qwen-VL, GLM-4V) made to take images
    record.py     the TorchFunctionMode and `_Recorder`: SDPA / MHA / softmax interception, watch_attention, _run
    describe.py   patch embedding, geometry, tokens, prefix tokens, output kind, preprocessing, labels: describe()
    stages.py     StagedModel: Hiera, DaViT run as written, shown per stage on windows of their grids
    model.py      LiveModel (a `vitviz.core.protocol.Model`, not a VitModel) and load_live
    code.py       module_from_code, load_weights, load_code: the only place a user's file is imported
"""
from vitviz.core.running.live.code import load_code, load_weights, module_from_code
from vitviz.core.running.live.describe import LIVE_OVERRIDES, Description, PatchEmbedding, describe, find_patch_embedding
from vitviz.core.running.live.errors import LiveModelError, LiveWarning, NoAttentionError, UserCodeError, user_call
from vitviz.core.running.live.model import LiveModel, load_live
from vitviz.core.running.live.packing import PackedTower, is_packed, packed_tower
from vitviz.core.running.live.record import (
    MHA, SDPA, SOFTMAX, AttentionLayout, sdpa_probabilities, sdpa_scores, watch_attention,
)

__all__ = [
    "LIVE_OVERRIDES", "MHA", "SDPA", "SOFTMAX", "AttentionLayout", "Description", "LiveModel", "LiveModelError",
    "LiveWarning", "NoAttentionError", "PackedTower", "PatchEmbedding", "UserCodeError", "describe",
    "find_patch_embedding", "is_packed", "load_code", "load_live", "load_weights", "module_from_code", "packed_tower",
    "sdpa_probabilities", "sdpa_scores", "user_call", "watch_attention",
]
