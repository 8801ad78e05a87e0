"""Wall-OSS's image path, as LeRobot's `wall_x` and the Hugging Face Qwen2-VL image processor
compute it, in torch alone (torchvision's CPU build is not on every machine).

1. LeRobot (`_resize_wall_x_image_batch`): uint8 frames resized bicubic with antialiasing to an
   intermediate size whose longer side is 256, then to the 28-aligned `smart_resize` of that;
2. the HF processor (`Qwen2VLImageProcessor`): its own `smart_resize` (patch x merge aligned,
   within its pixel bounds), the same resize, `(x - 255 mean) / (255 std)` in float32, the frame
   repeated to the temporal patch, and patches flattened in 2 x 2 merge-group order.

Resizes follow torchvision's `resize` on uint8: native uint8 interpolation on the CPU, float with
clamp and round elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from raytrain_vla.models.wall_x.config import (
    IMAGE_FACTOR,
    MAX_PIXELS,
    MIN_PIXELS,
    RESOLUTION,
    WallXConfig,
)

MAX_RATIO = 200  # Qwen's limit on an image's aspect ratio


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The (H, W) nearest to the image's, both multiples of `factor`, with a pixel count in
    [min_pixels, max_pixels] (Qwen's rule, as qwen-vl-utils and transformers write it)."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(
            f"an image of {height}x{width} has an aspect ratio above {MAX_RATIO}, which Qwen2.5-VL "
            "refuses"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def lerobot_sizes(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """LeRobot's intermediate size (longer side 256) and the 28-aligned size after it."""
    if width > height:
        mid = (int(RESOLUTION * height / width), RESOLUTION)
    else:
        mid = (RESOLUTION, int(RESOLUTION * width / height))
    return mid, smart_resize(*mid, IMAGE_FACTOR, MIN_PIXELS, MAX_PIXELS)


def processor_size(height: int, width: int, config: WallXConfig) -> tuple[int, int]:
    """The size the HF image processor brings a (height, width) frame to."""
    factor = config.patch_size * config.merge_size
    return smart_resize(height, width, factor, config.min_pixels, config.max_pixels)


def model_size(height: int, width: int, config: WallXConfig) -> tuple[int, int]:
    """The pixel size a camera of (height, width) reaches the vision tower at."""
    return processor_size(*lerobot_sizes(height, width)[1], config)


def patch_grid(height: int, width: int, config: WallXConfig) -> tuple[int, int, int]:
    """(t, h, w) patches of one camera frame at the vision tower (a still frame: t = 1)."""
    h, w = model_size(height, width, config)
    return 1, h // config.patch_size, w // config.patch_size


def tokens_per_image(height: int, width: int, config: WallXConfig) -> int:
    """Merged vision tokens (`<|image_pad|>` copies) of one camera frame."""
    t, h, w = patch_grid(height, width, config)
    return t * h * w // config.merge_size**2


def resize_uint8(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """torchvision's bicubic, antialiased `resize` of uint8 (N, C, H, W) frames."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    if images.device.type == "cpu":
        return F.interpolate(images, size=size, mode="bicubic", align_corners=False, antialias=True)
    out = F.interpolate(
        images.float(), size=size, mode="bicubic", align_corners=False, antialias=True
    )
    return out.clamp_(0, 255).round_().to(torch.uint8)


def lerobot_resize(images: torch.Tensor) -> torch.Tensor:
    """LeRobot's two resizes of a camera's uint8 (N, C, H, W) batch (float frames in [0, 1] are
    first truncated to uint8, as LeRobot's `(x * 255).to(uint8)`)."""
    if images.is_floating_point():
        images = (images * 255).to(torch.uint8)
    elif images.dtype != torch.uint8:
        raise TypeError(f"wall_x images must be uint8 or float in [0, 1], got {images.dtype}")
    mid, final = lerobot_sizes(*images.shape[-2:])
    return resize_uint8(resize_uint8(images, mid), final)


def patchify(images: torch.Tensor, config: WallXConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The HF processor on LeRobot-resized uint8 frames (N, C, H, W) of one size: flattened
    patches (N * patches, C * temporal * patch * patch) float32 and the grids (N, 3)."""
    n, channels = images.shape[:2]
    height, width = processor_size(*images.shape[-2:], config)
    images = resize_uint8(images, (height, width))
    mean = torch.tensor(config.image_mean, device=images.device) * (1.0 / (1 / 255))
    std = torch.tensor(config.image_std, device=images.device) * (1.0 / (1 / 255))
    pixels = (images.to(torch.float32) - mean[:, None, None]) / std[:, None, None]
    temporal, patch, merge = config.temporal_patch_size, config.patch_size, config.merge_size
    pixels = pixels[:, None].repeat(1, temporal, 1, 1, 1)  # a still frame fills the time patch
    grid_h, grid_w = height // patch, width // patch
    pixels = pixels.view(
        n, 1, temporal, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch
    )
    pixels = pixels.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    flat = pixels.reshape(n * grid_h * grid_w, channels * temporal * patch * patch)
    grids = torch.tensor([[1, grid_h, grid_w]] * n, dtype=torch.long, device=images.device)
    return flat, grids
