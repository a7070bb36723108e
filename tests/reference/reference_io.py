"""The file protocol every reference script shares (tests/unit/reference_harness.h):

    python <model>.py IN.safetensors OUT.safetensors

IN holds the model's parameters by the trainer's names, `inputs` and `targets`, the model's
options as string metadata, and optionally frozen tensors (buffers: weights that get no gradient,
integer tables) as `frozen.<name>` and, for packed documents, `positions` (int64 [n, T]: each
token's position within its document). run(loss_of) loads them (parameters as float32 leaves that
require grad; frozen tensors as they are, under their name without the prefix, in the same
dict), calls loss_of(meta, params, inputs, targets) (with positions=... when IN has them), runs
backward and writes OUT: `loss` (0-dim) and `grad.<name>` for every parameter."""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def run(loss_of, usage):
    if len(sys.argv) != 3:
        raise SystemExit(usage)
    src, dst = sys.argv[1], sys.argv[2]
    tensors = load_file(src)
    with safe_open(src, "pt") as f:
        meta = f.metadata()
    inputs, targets = tensors.pop("inputs"), tensors.pop("targets")
    extra = {"positions": tensors.pop("positions").long()} if "positions" in tensors else {}
    frozen = {name[len("frozen."):]: tensors.pop(name) for name in list(tensors)
              if name.startswith("frozen.")}
    params = {name: t.float().clone().requires_grad_(True) for name, t in tensors.items()}
    loss = loss_of(meta, {**frozen, **params}, inputs, targets, **extra)
    loss.backward()
    result = {"loss": loss.detach().reshape(())}
    for name, t in params.items():
        result["grad." + name] = t.grad.detach().contiguous()
    save_file(result, dst)


def hidden(positions):
    """The attention a packed batch forbids, from the definition: [n, 1, T, T], True where query
    i may not see key j: a later key, or one before the start of i's document (i -
    positions[i])."""
    steps = positions.shape[1]
    i = torch.arange(steps)[:, None]
    j = torch.arange(steps)[None, :]
    first = i[None] - positions[:, :, None]  # [n, T, 1]
    return ((j > i)[None] | (j[None] < first))[:, None]
