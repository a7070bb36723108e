"""PyTorch reference for the `gpt` model (Gpt), written from the definition in
src/models/gpt/gpt.h in plain tensor ops: the q/k/v split, causal mask, softmax and GELU (tanh)
formula are spelled out (no nn.MultiheadAttention, no scaled_dot_product_attention, no nn.GELU).

usage: python gpt.py IN.safetensors OUT.safetensors

IN holds the parameters by the trainer's names (wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
ln_f.bias) plus `inputs` and `targets` (int64 [n, T]; a target -100 is not counted) and, for
packed documents, `positions` (int64 [n, T]: each token's position within its document: its
position id, and token i attends token j iff j <= i and j >= i - positions[i]); its metadata holds
num_layers, heads, d_model and vocab_size as strings. OUT gets `loss` (0-dim, the mean
cross-entropy over the counted targets on the first vocab_size logits) and `grad.<name>` for
every parameter. Float32, no dropout.
"""
import math

import torch
import torch.nn.functional as F
from reference_io import hidden, run

LAYER_NORM_EPS = 1e-5


def linear(x, p, name):
    """torch.nn.Linear's layout: weight [out, in]."""
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def layer_norm(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], LAYER_NORM_EPS)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, p, name, heads, positions):
    n, steps, d = x.shape
    hd = d // heads
    qkv = linear(x, p, name + ".c_attn")
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    q, k, v = (t.reshape(n, steps, heads, hd).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [n, heads, T, T]
    scores = scores.masked_fill(hidden(positions), float("-inf"))  # within the document, causal
    a = torch.softmax(scores, dim=-1) @ v
    return linear(a.permute(0, 2, 1, 3).reshape(n, steps, d), p, name + ".c_proj")


def loss_of(p, tokens, targets, num_layers, heads, vocab, positions=None):
    n, steps = tokens.shape
    if positions is None:  # one sequence per row
        positions = torch.arange(steps).expand(n, steps)
    x = p["wte.weight"][tokens] + p["wpe.weight"][positions]
    for i in range(num_layers):
        b = f"h.{i}."
        x = x + attention(layer_norm(x, p, b + "ln_1"), p, b + "attn", heads, positions)
        m = gelu_tanh(linear(layer_norm(x, p, b + "ln_2"), p, b + "mlp.c_fc"))
        x = x + linear(m, p, b + "mlp.c_proj")
    x = layer_norm(x, p, "ln_f")
    logits = x @ p["wte.weight"].t()  # tied: the output projection is the token embedding
    logits = logits[..., :vocab]  # padded rows of wte are never predicted
    # The mean over the targets that are not -100 (ignore_index).
    return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)


def gpt_loss(meta, params, inputs, targets, positions=None):
    num_layers, heads = int(meta["num_layers"]), int(meta["heads"])
    d_model, vocab = int(meta["d_model"]), int(meta["vocab_size"])
    if params["wte.weight"].shape[1] != d_model or d_model % heads != 0:
        wte = tuple(params["wte.weight"].shape)
        raise SystemExit(f"metadata {meta} does not fit wte.weight {wte}")
    return loss_of(params, inputs.long(), targets.long(), num_layers, heads, vocab, positions)


if __name__ == "__main__":
    run(gpt_loss, __doc__)
