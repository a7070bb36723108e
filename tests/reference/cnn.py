"""PyTorch reference for the `cnn` model (RestorationCnn), written from the definition in
src/models/cnn.h: F.conv2d, pixel shuffle by reshape/permute, bilinear skip by F.interpolate.

usage: python cnn.py IN.safetensors OUT.safetensors

IN holds the parameters by the trainer's names plus `inputs` [n, C, h, w] and `targets`
[n, C, h*scale, w*scale]; its metadata holds the options as strings (channels, scale,
base_channels, num_blocks, loss). OUT gets `loss` (0-dim) and `grad.<name>` for every parameter.
Float32.
"""

import torch
import torch.nn.functional as F
from reference_io import run


def conv(x, p, name):
    return F.conv2d(x, p[name + ".weight"], p[name + ".bias"], padding=1)


def pixel_shuffle(x, r):
    """[n, C r r, h, w] -> [n, C, h r, w r]; channel c r r + i r + j of pixel (y, x) goes to
    channel c of pixel (y r + i, x r + j)."""
    n, crr, h, w = x.shape
    c = crr // (r * r)
    return x.reshape(n, c, r, r, h, w).permute(0, 1, 4, 2, 5, 3).reshape(n, c, h * r, w * r)


def forward(x, p, scale, num_blocks):
    f = conv(x, p, "head")
    y = f
    for i in range(num_blocks):
        y = y + conv(torch.relu(conv(y, p, f"blocks.{i}.conv1")), p, f"blocks.{i}.conv2")
    y = conv(y, p, "body_tail") + f
    for k in range({1: 0, 2: 1, 4: 2}[scale]):
        y = pixel_shuffle(conv(y, p, f"up.{k}"), 2)
    residual = conv(y, p, "tail")
    if scale == 1:
        return x + residual
    skip = F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
    return residual + skip


def cnn_loss(meta, params, inputs, targets):
    out = forward(inputs.float(), params, int(meta["scale"]), int(meta["num_blocks"]))
    targets = targets.float()
    if meta["loss"] == "l1":
        return (out - targets).abs().mean()
    if meta["loss"] == "mse":
        return ((out - targets) ** 2).mean()
    raise SystemExit(f"unknown loss {meta['loss']!r}")


if __name__ == "__main__":
    run(cnn_loss, __doc__)
