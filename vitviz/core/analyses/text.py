"""Text prompts as relevance targets for CLIP / SigLIP models: the text tower that goes with a loaded image tower.

    emb = text_embedding(model, ["a photo of a cat"])          # (1, E), unit rows, in the image embedding's space
    leg = prompt_relevance(model, "cat.jpg", "a photo of a cat")  # LeGrad of <normalize(image emb), text emb>

vitviz opens only the vision tower of a whole CLIP / SigLIP file (the text tower's tensors are listed in
`model.dropped`); the text tower is read again here, from where the model was loaded (`model.spec.source`), with
the library that defines it -- both optional, imported only when a prompt is asked for:

- a Hugging Face folder (`config.json` of a CLIPModel / SiglipModel, with tokenizer files): `transformers`
  (`AutoModel.from_pretrained`, safetensors when present, never remote code) and `AutoTokenizer`; the embedding is
  `get_text_features` normalised (SigLIP prompts padded to the full context, as SigLIP was trained);
- an open_clip / OpenAI CLIP file holding the text tower: `open_clip`, its model built from the
  `open_clip_config.json` beside the file, or for an OpenAI-layout file without one from the tensors' shapes (as
  open_clip's `build_model_from_openai_state_dict`, kept in float32); tokenised by open_clip's own BPE tokenizer
  (or the HF tokenizer named in the config, when its files lie beside the checkpoint); `encode_text(normalize=True)`.

The checkpoint is read as data only (`weights_only` / safetensors). Anything missing -- no text tower in the file,
no tokenizer, neither library installed -- is a `TextTowerError` saying which.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

import numpy as np

from vitviz.core.files import read_small_json
from vitviz.core.protocol import is_reference
from vitviz.errors import VitvizError

if TYPE_CHECKING:
    from vitviz.core.running.model import VitModel
    from vitviz.core.analyses.relevance import LeGradMap, Relevance

HF_TEXT_TYPES = ("clip", "siglip", "siglip2")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")


class TextTowerError(VitvizError, ValueError):
    """No text tower for a prompt: the file holds only the vision tower, no tokenizer is available, or the library
    that reads it (transformers / open_clip) is not installed."""


def _path_of(source: "VitModel | str | Path") -> Path:
    if isinstance(source, (str, Path)):
        return Path(source).expanduser()
    spec = getattr(source, "spec", None)
    if spec is None:
        raise TextTowerError(f"text_embedding: expected a loaded model or a checkpoint path, got {type(source).__name__}")
    if not is_reference(source):
        raise TextTowerError(f"{spec.source}: this model is not vitviz's reference ViT (family {spec.family!r}: a "
                             "module run from its own code has no converted checkpoint to read a text tower "
                             "beside); pass the checkpoint's path instead")
    path = Path(str(spec.source)).expanduser()
    if not path.exists():
        raise TextTowerError(f"the model was not loaded from a file ({spec.source!r}), so there is no text tower to "
                             "read; pass the whole CLIP / SigLIP checkpoint's path instead")
    return path


def _hf_config(path: Path) -> dict[str, Any] | None:
    folder = path if path.is_dir() else path.parent
    cfg = folder / "config.json"
    data = read_small_json(cfg)   # None: missing, not a regular file, not JSON, nested too deeply
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        return None  # a timm hub config (`architecture`), not a transformers model
    return data


def _need(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        pip = {"transformers": "transformers", "open_clip": "open_clip_torch"}[module]
        raise TextTowerError(f"{what} needs the optional package {pip!r}: pip install {pip}") from e


def text_embedding(source: "VitModel | str | Path", prompts: list[str]) -> np.ndarray:
    """Unit-length text embeddings of `prompts` from the text tower of a CLIP / SigLIP checkpoint.

    Args:
        source: a `VitModel` loaded from a whole CLIP / SigLIP file or folder (its `spec.source`), or that path.
        prompts: the texts.

    Returns:
        (n, E) float32, each row L2-normalised (as CLIP and SigLIP compare embeddings), E the size of the image
        embedding (`model.run(...).features`).

    Raises:
        TextTowerError: no text tower in the checkpoint (a vision-only file or folder), no tokenizer, transformers /
            open_clip not installed, a config the library cannot build.
    """
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts) or not prompts:
        raise TextTowerError("prompts: expected a non-empty list of strings")
    path = _path_of(source)
    cfg = _hf_config(path)
    if cfg is not None:
        return _hf_embedding(path if path.is_dir() else path.parent, cfg, list(prompts))
    return _open_clip_embedding(path, list(prompts))


# ---------------------------------------------------------------------------------------------------- transformers
def _hf_embedding(folder: Path, cfg: dict[str, Any], prompts: list[str]) -> np.ndarray:
    import torch

    kind = str(cfg.get("model_type"))
    if kind not in HF_TEXT_TYPES or not isinstance(cfg.get("text_config"), dict):
        raise TextTowerError(f"{folder}: a transformers {kind!r} model without a text tower (config.json has no "
                             f"text_config); a text prompt needs the whole CLIPModel / SiglipModel folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TextTowerError(f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...) beside the "
                             "model; save the model's tokenizer into the folder (tokenizer.save_pretrained(folder))")
    transformers = _need("transformers", "reading a Hugging Face text tower")
    safetensors = any(folder.glob("*.safetensors"))
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                               trust_remote_code=False)
        net = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                     use_safetensors=safetensors or None)
    except (OSError, ValueError, KeyError) as e:
        raise TextTowerError(f"{folder}: transformers could not open the text tower or tokenizer: {e}") from e
    if not hasattr(net, "get_text_features"):
        raise TextTowerError(f"{folder}: {type(net).__name__} has no text tower (get_text_features)")
    net.eval()
    if kind == "clip":
        tok = tokenizer(prompts, padding=True, truncation=True, return_tensors="pt")
    else:  # SigLIP was trained on prompts padded to the full context
        length = int(cfg["text_config"].get("max_position_embeddings", 64))
        tok = tokenizer(prompts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    inputs = {k: v for k, v in tok.items() if k in ("input_ids", "attention_mask")}
    if kind != "clip":
        inputs.pop("attention_mask", None)  # SiglipModel's own examples pass only input_ids
    with torch.no_grad():
        out = net.get_text_features(**inputs)
        emb = out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 5 returns an output object
        emb = emb / emb.norm(p=2, dim=-1, keepdim=True)
    return emb.float().cpu().numpy()


# ------------------------------------------------------------------------------------------------------- open_clip
def _open_clip_embedding(path: Path, prompts: list[str]) -> np.ndarray:
    import torch

    from vitviz.core.reading.checkpoint import read_checkpoint

    raw = read_checkpoint(path)
    sd = {k: v for k, v in raw.tensors.items() if isinstance(v, torch.Tensor)}
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    has_text = "token_embedding.weight" in sd or any(k.startswith("text.") for k in sd)
    if not has_text:
        raise TextTowerError(f"{raw.path}: the file holds no text tower (no token_embedding / text.* tensors: a "
                             "vision tower alone); a text prompt needs the whole CLIP / SigLIP checkpoint")
    open_clip = _need("open_clip", "reading an open_clip / OpenAI CLIP text tower")
    cfg = _sidecar_model_cfg(raw.sidecars)
    if cfg is None:
        if "token_embedding.weight" not in sd or "visual.conv1.weight" not in sd:
            raise TextTowerError(f"{raw.path}: a CLIP file without an open_clip_config.json beside it, and not the "
                                 "OpenAI layout whose architecture its shapes give; put the model's "
                                 "open_clip_config.json next to the file")
        cfg = _openai_cfg(sd)
    _check_text_memory(cfg, raw.path)
    model_cfg = {k: v for k, v in cfg.items() if k not in ("custom_text", "_file")}
    custom = bool(cfg.get("custom_text")) or "hf_model_name" in cfg.get("text_cfg", {}) or \
        any(k.startswith("text.") for k in sd)
    try:
        net = (open_clip.CustomTextCLIP if custom else open_clip.CLIP)(**model_cfg)
        missing, unexpected = net.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    except Exception as e:  # noqa: BLE001 -- any build failure of a foreign config is reported as such
        raise TextTowerError(f"{raw.path}: open_clip could not build the model from its config: {e}") from e
    text_missing = [k for k in missing if not k.startswith("visual.")]
    if text_missing:
        raise TextTowerError(f"{raw.path}: the text tower does not match the config: missing "
                             f"{', '.join(text_missing[:5])}{' ...' if len(text_missing) > 5 else ''}")
    net.float().eval()
    tokenizer = _open_clip_tokenizer(open_clip, cfg, raw.path)
    with torch.no_grad():
        emb = net.encode_text(tokenizer(prompts), normalize=True)
    return emb.float().cpu().numpy()


def _check_text_memory(cfg: dict[str, Any], path: Path) -> None:
    """Refuse, before open_clip builds it, a text tower whose weights and causal mask (context_length^2 floats)
    would not fit in the memory left; its config's fields were checked when the file was read
    (`validate.check_open_clip_config`).

    Raises:
        DeviceError: naming the text tower's size, context length and the memory available.
    """
    from vitviz.core.running.runtime import CHECK_FROM, available_memory, format_bytes
    from vitviz.errors import DeviceError

    text_cfg = cfg.get("text_cfg") if isinstance(cfg.get("text_cfg"), dict) else {}
    if "hf_model_name" in text_cfg:
        return   # a Hugging Face text model, built by transformers from its own config
    width, layers = int(text_cfg.get("width", 512)), int(text_cfg.get("layers", 12))
    context, vocab = int(text_cfg.get("context_length", 77)), int(text_cfg.get("vocab_size", 49408))
    ratio = float(text_cfg.get("mlp_ratio", 4.0))
    params = vocab * width + context * width + layers * (4 + 2 * ratio) * width * width + \
        int(cfg.get("embed_dim", width)) * width
    needed = int(4 * params + 4 * context * context)   # float32 weights + the (context, context) causal mask
    free = available_memory() if needed >= CHECK_FROM else None
    if free is not None and needed > free:
        raise DeviceError(f"{path}: the text tower (width {width}, {layers} layers, vocabulary {vocab:,}, "
                          f"context_length {context:,}) needs {format_bytes(needed)} for its weights and causal mask, "
                          f"but only {format_bytes(free)} of memory is available; nothing was built")


def _sidecar_model_cfg(sidecars: list[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    for _name, data in sidecars:
        cfg = data.get("model_cfg", data) if isinstance(data, dict) else None
        if isinstance(cfg, dict) and isinstance(cfg.get("vision_cfg"), dict) and isinstance(cfg.get("text_cfg"), dict):
            return dict(cfg)
    return None


def _openai_cfg(sd: dict[str, Any]) -> dict[str, Any]:
    """The architecture of an OpenAI-layout ViT CLIP from its shapes, as open_clip's
    `build_model_from_openai_state_dict` infers it (ViT-B/32, B/16, L/14, ...), QuickGELU."""
    width = int(sd["visual.conv1.weight"].shape[0])
    patch = int(sd["visual.conv1.weight"].shape[-1])
    grid = round((int(sd["visual.positional_embedding"].shape[0]) - 1) ** 0.5)
    text_width = int(sd["ln_final.weight"].shape[0])
    count = lambda prefix: len({k.split(".")[len(prefix.split("."))] for k in sd if k.startswith(prefix + ".")})  # noqa: E731
    return {"embed_dim": int(sd["text_projection"].shape[1]), "quick_gelu": True,
            "vision_cfg": {"layers": count("visual.transformer.resblocks"), "width": width, "patch_size": patch,
                           "image_size": patch * grid},
            "text_cfg": {"context_length": int(sd["positional_embedding"].shape[0]),
                         "vocab_size": int(sd["token_embedding.weight"].shape[0]), "width": text_width,
                         "heads": text_width // 64, "layers": count("transformer.resblocks")}}


def _open_clip_tokenizer(open_clip: Any, cfg: dict[str, Any], path: Path) -> Any:
    text_cfg = cfg.get("text_cfg", {})
    context = int(text_cfg.get("context_length", 77))
    name = text_cfg.get("hf_tokenizer_name")
    if name:
        folder = path if path.is_dir() else path.parent
        if not any((folder / f).is_file() for f in TOKENIZER_FILES):
            raise TextTowerError(f"{path}: the model's tokenizer is the Hugging Face tokenizer {name!r}, whose files "
                                 f"are not beside the checkpoint; save them into {folder} "
                                 f"(AutoTokenizer.from_pretrained({name!r}).save_pretrained(...))")
        from open_clip.tokenizer import HFTokenizer

        return HFTokenizer(str(folder), context_length=context, **(cfg.get("tokenizer_kwargs") or {}))
    vocab = int(text_cfg.get("vocab_size", 49408))
    tokenizer = open_clip.SimpleTokenizer(context_length=context)
    if vocab < len(tokenizer.encoder):
        raise TextTowerError(f"{path}: the text tower has a vocabulary of {vocab} tokens, smaller than open_clip's "
                             f"CLIP tokenizer's {len(tokenizer.encoder)}: no tokenizer for it is available")
    return tokenizer


# ------------------------------------------------------------------------------------------------------- relevance
def prompt_relevance(model: "VitModel", image: Any, prompt: str,
                     method: Literal["legrad", "chefer"] = "legrad", **kwargs: Any) -> "Union[LeGradMap, Relevance]":
    """The relevance of `image` for a text prompt: the text tower's embedding of `prompt` (`text_embedding`) as the
    target of `legrad` (method 'legrad') or of `class_relevance` (method 'chefer': Chefer relevance, gradient
    rollout and attention x gradient), scoring <normalize(image embedding), text embedding>.

    Raises:
        TextTowerError: no text tower / tokenizer (see `text_embedding`).
        RelevanceError: the model's output is not the size of the text embedding (no projection head), or what
            `legrad` / `class_relevance` refuse.
    """
    from vitviz.core.analyses.relevance import RelevanceError, class_relevance, legrad

    if method not in ("legrad", "chefer"):
        raise RelevanceError(f"method {method!r}: expected 'legrad' or 'chefer'")
    target = text_embedding(model, [prompt])[0]
    return (legrad if method == "legrad" else class_relevance)(model, image, target, **kwargs)


def prompt_label(prompt: str) -> str:
    """A file-name-safe label of a prompt, unique and stable: its readable part (at most 60 characters of the
    prompt, lowercased, other characters as '_') and the first 8 hex digits of the SHA-256 of the prompt itself
    (its whitespace runs as one space, as `MapKind.parse` keeps it): 'text-a_photo_of_a_cat-2c4f0e1a'. Prompts
    that read alike ('a cat', 'A CAT!'), share 60 characters or have none in [a-z0-9] ('一只猫', '一只狗') get
    different labels, so no map overwrites another's file."""
    import hashlib

    text = " ".join(str(prompt).split())
    slug = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60].strip("_")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"text-{slug or 'prompt'}-{digest}"
