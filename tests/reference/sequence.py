"""PyTorch reference for the `sequence` model (SequenceForecaster), written from the definition in
src/models/sequence.h in plain tensor ops (no nn.LSTM, no scaled_dot_product_attention).

usage: python sequence.py IN.safetensors OUT.safetensors

IN holds the parameters by the trainer's names plus `inputs` [n, T, features] and `targets`
[n, horizon, targets]; its metadata holds the options as strings (cell, features, window, horizon,
targets, hidden_dim, num_layers, d_model, heads). OUT gets `loss` (0-dim, the mean squared error)
and `grad.<name>` for every parameter. Float32, dropout 0.
"""
import math

import torch
from reference_io import run

LAYER_NORM_EPS = 1e-5


def lstm_last(x, p, num_layers, hidden):
    """The last step's output of a stacked LSTM, gates i, f, g, o in torch.nn.LSTM's layout."""
    n, steps, _ = x.shape
    seq = x
    for k in range(num_layers):
        w_ih, w_hh = p[f"lstm.weight_ih_l{k}"], p[f"lstm.weight_hh_l{k}"]
        b_ih, b_hh = p[f"lstm.bias_ih_l{k}"], p[f"lstm.bias_hh_l{k}"]
        h = x.new_zeros(n, hidden)
        c = x.new_zeros(n, hidden)
        outputs = []
        for t in range(steps):
            gates = seq[:, t] @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh
            i = torch.sigmoid(gates[:, 0 * hidden:1 * hidden])
            f = torch.sigmoid(gates[:, 1 * hidden:2 * hidden])
            g = torch.tanh(gates[:, 2 * hidden:3 * hidden])
            o = torch.sigmoid(gates[:, 3 * hidden:4 * hidden])
            c = f * c + i * g
            h = o * torch.tanh(c)
            outputs.append(h)
        seq = torch.stack(outputs, dim=1)
    return seq[:, -1]


def linear(x, p, name):
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def layer_norm(x, p, name):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LAYER_NORM_EPS) * p[name + ".weight"] + p[name + ".bias"]


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def transformer_last(x, p, num_layers, d, heads):
    n, steps, _ = x.shape
    hd = d // heads
    x = linear(x, p, "in_proj") + p["pos"][:steps]
    for i in range(num_layers):
        b = f"blocks.{i}."
        qkv = linear(layer_norm(x, p, b + "ln_1"), p, b + "attn.qkv")
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        q, k, v = (t.reshape(n, steps, heads, hd).permute(0, 2, 1, 3) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [n, heads, T, T], no mask
        a = torch.softmax(scores, dim=-1) @ v
        a = a.permute(0, 2, 1, 3).reshape(n, steps, d)
        x = x + linear(a, p, b + "attn.proj")
        m = linear(layer_norm(x, p, b + "ln_2"), p, b + "mlp.fc")
        x = x + linear(gelu_erf(m), p, b + "mlp.proj")
    return layer_norm(x, p, "ln_f")[:, -1]


def sequence_loss(meta, params, inputs, targets):
    inputs, targets = inputs.float(), targets.float()
    cell = meta["cell"]
    num_layers = int(meta["num_layers"])
    horizon, n_targets = int(meta["horizon"]), int(meta["targets"])
    if cell == "lstm":
        last = lstm_last(inputs, params, num_layers, int(meta["hidden_dim"]))
    elif cell == "transformer":
        d_model, heads = int(meta["d_model"]), int(meta["heads"])
        last = transformer_last(inputs, params, num_layers, d_model, heads)
    else:
        raise SystemExit(f"unknown cell {cell!r}")
    out = linear(last, params, "head").reshape(inputs.shape[0], horizon, n_targets)
    return ((out - targets) ** 2).mean()


if __name__ == "__main__":
    run(sequence_loss, __doc__)
