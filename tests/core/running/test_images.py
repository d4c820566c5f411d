"""Image loading, preprocessing and folder scanning (vitviz.core.running.images); a resize target is checked like a
source (issue 20)."""
from __future__ import annotations

import io
import struct
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from _hostile import quiet_load
from PIL import Image, ImageFile

import vitviz
from vitviz.cli import main

from vitviz.core.running.images import (
    BLACK,
    MAX_PIXELS,
    cover_size,
    display_from_tensor,
    find_images,
    is_image_file,
    load_image,
    preprocess,
)
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from vitviz.errors import ImageError

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _noise(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _close(pixel: tuple, expected: tuple, tol: int = 12) -> bool:
    return all(abs(int(a) - int(b)) <= tol for a, b in zip(pixel, expected))


# ------------------------------------------------------------------------------------ awkward but valid


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 8), (0, 255, 255, 0)).save(path, quality=95)  # pure red in CMYK
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (16, 8)
    assert _close(img.getpixel((8, 4)), RED)


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "deep.png"
    arr = np.array([[0, 257 * 128, 65535]], dtype=np.uint16)
    Image.fromarray(arr).save(path)
    with Image.open(path) as raw:
        assert raw.mode.startswith("I")
    img = load_image(path)
    assert img.mode == "RGB"
    assert [img.getpixel((i, 0)) for i in range(3)] == [(0, 0, 0), (128, 128, 128), (255, 255, 255)]
    assert load_image(path, channels=1).mode == "L"


def test_palette_png_with_transparency_is_composited(tmp_path: Path) -> None:
    path = tmp_path / "pal.png"
    img = Image.new("P", (4, 2), 0)
    img.putpalette([*RED, *BLUE] + [0] * 762)
    img.putpixel((3, 1), 1)
    img.save(path, transparency=0)  # palette index 0 (red) is transparent
    out = load_image(path)
    assert out.mode == "RGB"
    assert out.getpixel((0, 0)) == (255, 255, 255)  # not red: composited over white
    assert out.getpixel((3, 1)) == BLUE
    assert load_image(path, background=BLACK).getpixel((0, 0)) == BLACK


def test_la_png_composited_and_stays_grey(tmp_path: Path) -> None:
    path = tmp_path / "la.png"
    img = Image.new("LA", (2, 1))
    img.putpixel((0, 0), (100, 0))
    img.putpixel((1, 0), (100, 255))
    img.save(path)
    assert load_image(path).getpixel((0, 0)) == (255, 255, 255)
    assert load_image(path).getpixel((1, 0)) == (100, 100, 100)
    assert load_image(path, channels=1).getpixel((1, 0)) == 100


def test_rgba_half_alpha_over_white_or_black() -> None:
    img = Image.new("RGBA", (2, 2), (0, 0, 0, 128))
    assert _close(load_image(img).getpixel((0, 0)), (127, 127, 127), tol=1)
    assert _close(load_image(img, background=BLACK).getpixel((0, 0)), (0, 0, 0), tol=0)


def test_animated_gif_gives_first_frame(tmp_path: Path) -> None:
    path = tmp_path / "anim.gif"
    frames = [Image.new("RGB", (10, 6), c) for c in (RED, GREEN, BLUE)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    with Image.open(path) as raw:
        assert raw.n_frames == 3
    img = load_image(path)
    assert img.size == (10, 6) and _close(img.getpixel((5, 3)), RED, tol=2)


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    # Stored 40 wide x 20 tall, red top-left quadrant. Orientation 6 = "rotate 90 degrees clockwise to view":
    # the viewer sees 20 wide x 40 tall, with the red quadrant at the top right.
    stored = Image.new("RGB", (40, 20), BLUE)
    stored.paste(RED, (0, 0, 20, 10))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    stored.save(path, exif=exif, quality=95)
    img = load_image(path)
    assert img.size == (20, 40)
    assert _close(img.getpixel((15, 5)), RED)  # top right
    assert _close(img.getpixel((5, 5)), BLUE)  # top left
    assert _close(img.getpixel((15, 35)), BLUE)  # bottom right


def test_one_by_one_image_loads_and_preprocesses(tmp_path: Path) -> None:
    path = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), GREEN).save(path)
    img = load_image(path)
    assert img.size == (1, 1)
    x, disp = preprocess(img, Preprocess(crop=(224, 224), resize=256))
    assert x.shape == (1, 3, 224, 224) and disp.shape == (224, 224, 3)
    assert (disp == np.array(GREEN, dtype=np.uint8)).all()


def test_bytes_file_object_and_pil_inputs(tmp_path: Path) -> None:
    buf = io.BytesIO()
    _noise(7, 5).save(buf, format="PNG")
    data = buf.getvalue()
    expected = np.asarray(_noise(7, 5))
    for source in (data, bytearray(data), memoryview(data), io.BytesIO(data), Image.open(io.BytesIO(data))):
        assert np.array_equal(np.asarray(load_image(source)), expected)


@pytest.mark.parametrize(
    "arr, expected",
    [
        (np.full((3, 4), 200, np.uint8), (200, 200, 200)),
        (np.full((3, 4, 1), 7, np.uint8), (7, 7, 7)),
        (np.full((3, 4, 3), (1, 2, 3), np.uint8), (1, 2, 3)),
        (np.full((3, 4, 4), (10, 20, 30, 255), np.uint8), (10, 20, 30)),
        (np.full((3, 4), 65535, np.uint16), (255, 255, 255)),
        (np.full((3, 4, 3), 0.5, np.float32), (128, 128, 128)),
        (np.ones((3, 4), bool), (255, 255, 255)),
    ],
)
def test_numpy_arrays(arr: np.ndarray, expected: tuple) -> None:
    img = load_image(arr)
    assert img.mode == "RGB" and img.size == (4, 3)
    assert img.getpixel((1, 1)) == expected


@pytest.mark.parametrize(
    "arr, words",
    [
        (np.full((3, 4), 1.5, np.float32), "[0, 1]"),
        (np.full((3, 4), np.nan, np.float64), "NaN"),
        (np.zeros((3, 8, 8), np.uint8), "channels first"),
        (np.zeros((3, 4), np.int64), "int64"),
        (np.zeros((0, 4), np.uint8), "empty"),
    ],
)
def test_bad_numpy_arrays(arr: np.ndarray, words: str) -> None:
    with pytest.raises(ImageError, match="expected") as err:
        load_image(arr)
    assert words in str(err.value)


# ------------------------------------------------------------------------------------------- bad inputs


def test_text_file_named_png(tmp_path: Path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("this is not an image\n")
    with pytest.raises(ImageError, match="not a recognised image format") as err:
        load_image(path)
    assert str(path) in str(err.value) and "expected" in str(err.value)


def test_random_bytes() -> None:
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(ImageError, match="4096 bytes"):
        load_image(data)


@pytest.mark.parametrize("fmt, suffix", [("PNG", ".png"), ("JPEG", ".jpg")])
def test_truncated_files_fail(tmp_path: Path, fmt: str, suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    _noise(256, 256).save(buf, format=fmt)
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with Image.open(path):  # the header alone is fine: only a full decode can notice
        pass
    with pytest.raises(ImageError, match="truncated") as err:
        load_image(path)
    assert str(path) in str(err.value)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # someone else's global setting
    with pytest.raises(ImageError):
        load_image(path)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # and it is restored


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height RGB pixels, with one tiny (wrong) IDAT."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def test_decompression_bomb_header(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header_only(100_000, 100_000))
    pil_limit = Image.MAX_IMAGE_PIXELS
    with pytest.raises(ImageError, match="pixels") as err:
        load_image(path)
    assert str(path) in str(err.value) and str(MAX_PIXELS) in str(err.value)
    assert Image.MAX_IMAGE_PIXELS == pil_limit  # Pillow's global limit is restored


@pytest.mark.parametrize("limit", [300, 100])  # 400 px: Pillow's warning zone (<= 2x), then its error zone
def test_decompression_bomb_limit_is_explicit(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "small.png"
    _noise(20, 20).save(path)
    with warnings.catch_warnings(record=True) as seen, pytest.raises(ImageError, match="pixels"):
        warnings.simplefilter("always")
        load_image(path, max_pixels=limit)
    assert not seen  # Pillow's DecompressionBombWarning became the error instead of leaking out
    assert load_image(path, max_pixels=400).size == (20, 20)


def test_missing_path_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="not found") as err:
        load_image(tmp_path / "nope.jpg")
    assert "nope.jpg" in str(err.value)
    with pytest.raises(ImageError, match="a folder, not a regular file"):
        load_image(tmp_path)
    with pytest.raises(ImageError, match="unsupported input type"):
        load_image(12345)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- preprocess


@pytest.mark.parametrize("mode", ["center", "squash"])
@pytest.mark.parametrize("crop", [(224, 224), (224, 448), (384, 192)])
@pytest.mark.parametrize("size", [(300, 400), (400, 300), (50, 1000)])
def test_preprocess_shapes(mode: str, crop: tuple[int, int], size: tuple[int, int]) -> None:
    pp = Preprocess(crop=crop, resize=int(min(crop) * 256 / 224), mode=mode)
    x, disp = preprocess(_noise(*size), pp)
    assert x.shape == (1, 3, *crop) and x.dtype == torch.float32
    assert disp.shape == (*crop, 3) and disp.dtype == np.uint8


def test_cover_size() -> None:
    assert cover_size((480, 640), (224, 224), 256) == (256, 341)  # torchvision: int(256 * 640 / 480)
    assert cover_size((640, 480), (224, 224), 256) == (341, 256)
    assert cover_size((500, 500), (224, 448), 256) == (512, 512)  # must cover 256 x 512
    assert cover_size((100, 1000), (224, 448), 256) == (256, 2560)
    assert cover_size((1000, 100), (224, 448), 256) == (5120, 512)
    assert cover_size((1, 1), (224, 224), 200) == (224, 224)  # resize < crop never under-covers


def test_center_crop_of_non_square_crop_is_centred() -> None:
    # 500x500: red left half, blue right half; crop (224, 448) -> resized to 512x512, cropped 32 px each side.
    img = Image.new("RGB", (500, 500), RED)
    img.paste(BLUE, (250, 0, 500, 500))
    _, disp = preprocess(img, Preprocess(crop=(224, 448), resize=256, interpolation="nearest"))
    assert (disp[:, :220] == RED).all() and (disp[:, 228:] == BLUE).all()


def test_squash_matches_plain_resize() -> None:
    img = _noise(300, 100)
    _, disp = preprocess(img, Preprocess(crop=(64, 32), mode="squash", interpolation="bilinear"))
    assert np.array_equal(disp, np.asarray(img.resize((32, 64), Image.Resampling.BILINEAR)))


@pytest.mark.parametrize("interp", ["bicubic", "bilinear", "nearest", "lanczos", "box"])
def test_interpolation_names(interp: str) -> None:
    x, _ = preprocess(_noise(40, 30), Preprocess(crop=(16, 16), resize=18, interpolation=interp))
    assert x.shape == (1, 3, 16, 16)


@pytest.mark.parametrize("field, value", [("interpolation", "cubic"), ("mode", "pad"), ("std", (0.0,) * 3),
                                          ("mean", (0.5, 0.5))])
def test_bad_recipe(field: str, value: object) -> None:
    pp = Preprocess(crop=(8, 8), resize=8, **{field: value})
    with pytest.raises(ImageError, match="expected"):
        preprocess(_noise(10, 10), pp)


def test_mean_std_applied() -> None:
    img = Image.new("RGB", (10, 10), (51, 102, 204))
    pp = Preprocess(crop=(8, 8), resize=8, mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 2.0))
    x, disp = preprocess(img, pp)
    expected = [(51 / 255 - 0.1) / 0.5, (102 / 255 - 0.2) / 0.25, (204 / 255 - 0.3) / 2.0]
    assert torch.allclose(x[0, :, 4, 4], torch.tensor(expected), atol=1e-6)
    assert (disp == (51, 102, 204)).all()


def test_single_channel_averages_three_value_stats() -> None:
    img = Image.new("L", (10, 10), 128)
    pp = Preprocess(crop=(8, 8), resize=8, mean=(0.2, 0.4, 0.6), std=(0.1, 0.2, 0.3))
    x, disp = preprocess(img, pp, channels=1)
    assert x.shape == (1, 1, 8, 8)
    assert torch.allclose(x, torch.full_like(x, (128 / 255 - 0.4) / 0.2), atol=1e-6)
    assert disp.shape == (8, 8, 3) and (disp == 128).all()


def test_display_from_tensor_round_trip() -> None:
    pp = Preprocess(crop=(32, 48), resize=40, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    x, disp = preprocess(_noise(70, 50), pp)
    assert np.array_equal(display_from_tensor(x, pp.mean, pp.std), disp)
    x1, disp1 = preprocess(_noise(70, 50), pp, channels=1)
    assert np.array_equal(display_from_tensor(x1, pp.mean, pp.std), disp1)
    with pytest.raises(ImageError, match="shape"):
        display_from_tensor(torch.zeros(2, 3, 4, 4), pp.mean, pp.std)


@pytest.mark.parametrize("size", [(333, 517), (517, 333), (256, 256), (399, 256)])  # 399: odd crop margin
def test_matches_torchvision_vit_b_16_preset(size: tuple[int, int]) -> None:
    from torchvision.models import ViT_B_16_Weights

    preset = ViT_B_16_Weights.IMAGENET1K_V1.transforms()
    img = _noise(*size, seed=3)
    pp = Preprocess(crop=(224, 224), resize=256, interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    ours, _ = preprocess(img, pp)
    ref = preset(img).unsqueeze(0)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ folder scanning


def test_is_image_file() -> None:
    for name in ("a.png", "b.JPG", "c.jpeg", "d.bmp", "e.gif", "f.tif", "g.TIFF", "h.webp", "i.ppm", "j.pgm"):
        assert is_image_file(name), name
    for name in ("a.txt", "b.png.bak", "noext", "c.pth"):
        assert not is_image_file(name), name


def test_find_images_natural_order(tmp_path: Path) -> None:
    for rel in ("img10.png", "img2.png", "img1.JPG", "notes.txt", "._img3.jpg", "sub/img1.png", "sub/x.gif",
                ".hidden/img0.png", "Sub2/a.webp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    rels = [p.relative_to(tmp_path).as_posix() for p in find_images(tmp_path)]
    assert rels == ["img1.JPG", "img2.png", "img10.png", "sub/img1.png", "sub/x.gif", "Sub2/a.webp"]
    flat = [p.name for p in find_images(tmp_path, recursive=False)]
    assert flat == ["img1.JPG", "img2.png", "img10.png"]
    assert [p.name for p in find_images(tmp_path, pattern="IMG1*")] == ["img1.JPG", "img10.png", "img1.png"]
    with pytest.raises(ImageError, match="not found"):
        find_images(tmp_path / "missing")
    with pytest.raises(ImageError, match="not a folder"):
        find_images(tmp_path / "img2.png")


def test_module_does_not_import_torch() -> None:
    code = "import sys, vitviz.core.running.images; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


# ------------------------------------------------------------------------------------------- a resize target (issue 20)

def test_resize_target_is_checked_like_a_source(tiny_ckpt: Path, tmp_path: Path, photo: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.errors import ImageError, OverrideError

    with pytest.raises(OverrideError, match="resize 60000; expected at most 14142"):
        vitviz.load(tiny_ckpt, heads=2, resize=60000)
    assert main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(tmp_path / "o"),
                     "--resize", "60000", "--quiet"]) == 2
    assert "expected at most 14142" in capsys.readouterr().err
    strip = tmp_path / "strip.png"
    Image.new("RGB", (2000, 8)).save(strip)     # shorter side 8 -> 14000 px: 14000 x 3.5 million
    model = quiet_load(tiny_ckpt, heads=2, resize=14000)
    resized: list[tuple[int, int]] = []
    original = Image.Image.resize
    monkeypatch.setattr(Image.Image, "resize", lambda img, size, *a, **k: resized.append(size) or original(img, size,
                                                                                                              *a, **k))
    with pytest.raises(ImageError, match=r"resizing its 2000x8 px to .* MP\) is refused.*200 MP"):
        model.run(strip)
    assert not [size for size in resized if size[0] * size[1] > 200_000_000]   # refused before resizing
