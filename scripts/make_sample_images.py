#!/usr/bin/env python3
"""Write a seeded set of synthetic RGB PNG images for the image (denoising / super-resolution) data.

Each image has structure a CNN can learn from, at several scales:
  - a smooth background gradient between two random colours, in a random direction;
  - a stripe or checkerboard texture over part of the image;
  - overlapping random rectangles and circles (ellipses) with flat or graded fills;
  - a light Gaussian blur on some layers, so edges come both sharp and soft;
  - a little fine-grained texture (low-amplitude seeded noise), as in photographs.

Uses Pillow and numpy (the trainer's virtualenv has both); nothing is downloaded. The same
arguments give the same files.

  ~/.cache/trainer/torch-2.11.0/bin/python scripts/make_sample_images.py \\
      --out data/images-sample --count 16 --size 160
"""

import argparse
import os

try:
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter
except ModuleNotFoundError as e:  # e.g. the system python3: run again under the project's Python
    import project_python  # beside this file: the standard library only
    project_python.reexec(__file__, e.name)


def random_colour(rng):
    return tuple(int(v) for v in rng.integers(0, 256, size=3))


def gradient(rng, size):
    a = np.array(random_colour(rng), dtype=np.float32)
    b = np.array(random_colour(rng), dtype=np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
    t = (np.cos(angle) * xs + np.sin(angle) * ys)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = a[None, None, :] * (1 - t[..., None]) + b[None, None, :] * t[..., None]
    return img


def texture(rng, size):
    """A stripe or checker pattern (float mask in [0, 1]) over a random region."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    period = rng.uniform(4, 16)
    if rng.random() < 0.5:
        angle = rng.uniform(0, np.pi)
        u = np.cos(angle) * xs + np.sin(angle) * ys
        pattern = (np.sin(2 * np.pi * u / period) > 0).astype(np.float32)
    else:
        pattern = ((np.floor(xs / period) + np.floor(ys / period)) % 2).astype(np.float32)
    x0, y0 = rng.integers(0, size // 2, size=2)
    x1 = x0 + rng.integers(size // 4, size // 2 + 1)
    y1 = y0 + rng.integers(size // 4, size // 2 + 1)
    region = np.zeros((size, size), dtype=np.float32)
    region[y0:y1, x0:x1] = 1.0
    return pattern * region


def shapes(rng, size, base):
    img = Image.fromarray(base)
    for _ in range(int(rng.integers(5, 12))):
        layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        x0, y0 = (int(v) for v in rng.integers(-size // 8, size, size=2))
        w, h = (int(v) for v in rng.integers(size // 10, size // 2, size=2))
        colour = random_colour(rng) + (int(rng.integers(160, 256)),)
        if rng.random() < 0.5:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=colour)
        else:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=colour,
                         outline=random_colour(rng) if rng.random() < 0.5 else None,
                         width=int(rng.integers(1, 4)))
        if rng.random() < 0.3:
            layer = layer.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.8, 2.5))))
        img = Image.alpha_composite(img.convert("RGBA"), layer).convert("RGB")
    return img


def make_image(rng, size):
    img = gradient(rng, size)
    mask = texture(rng, size)[..., None]
    img = img * (1 - mask) + np.array(random_colour(rng), dtype=np.float32) * mask
    img = shapes(rng, size, np.clip(img, 0, 255).astype(np.uint8))
    if rng.random() < 0.4:
        img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 1.2))))
    arr = np.asarray(img).astype(np.float32)
    arr += rng.normal(0.0, 2.0, size=arr.shape)  # fine grain
    return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), mode="RGB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/images-sample")
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for k in range(args.count):
        rng = np.random.default_rng([args.seed, k])
        path = os.path.join(args.out, f"img_{k:03d}.png")
        make_image(rng, args.size).save(path, optimize=True)
        total += os.path.getsize(path)
    print(f"wrote {args.count} images of {args.size}x{args.size} to {args.out} ({total} bytes)")


if __name__ == "__main__":
    main()
