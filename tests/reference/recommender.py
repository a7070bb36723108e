"""PyTorch reference for the `recommender` model (Recommender), written from the definitions in
src/models/recommender.h and src/models/text_encoder.h in plain tensor ops: the text encoder's
attention mask (causal, padding keys out, every query sees itself), softmax, both GELUs (tanh in
the encoder, erf in the tower), the masked mean pooling and the BPR loss are spelled out (no
nn.MultiheadAttention, no scaled_dot_product_attention, no nn.GELU, no logsigmoid).

usage: python recommender.py IN.safetensors OUT.safetensors

IN holds the trainable parameters by the trainer's names (user_embedding.weight,
item_embedding.weight, tower.{i}.weight and .bias in torch.nn.Linear's [out, in] layout), the
frozen text encoder's weights as frozen.text_encoder.<GPT-2 name> (Conv1D's [in, out] layout) and
the item texts as frozen.item_text (int64 [num_items, L]: bytes, padded with 256), plus `inputs`
(int64 [n, 3]: user, positive item, negative item) and `targets` (ignored). Its metadata holds
encoder_layers, encoder_heads and mlp_depth as strings. The item metadata vectors are computed
here from the encoder's weights and the texts, not read from the model's cache. OUT gets `loss`
(0-dim) and `grad.<name>` for every trainable parameter. Float32.
"""
import math

import torch
from gpt import gelu_tanh
from reference_io import run
from sequence import gelu_erf, layer_norm, linear  # layer_norm spelled out, eps 1e-5 (GPT-2's)

PAD_ID = 256


def conv1d(x, p, name):
    """GPT-2's Conv1D layout: weight [in, out]."""
    return x @ p[name + ".weight"] + p[name + ".bias"]


def encode(p, tokens, layers, heads):
    """The frozen text encoder: [n, L] tokens -> [n, out_dim]."""
    n, steps = tokens.shape
    e = "text_encoder."
    d = p[e + "wte.weight"].shape[1]
    hd = d // heads
    x = p[e + "wte.weight"][tokens] + p[e + "wpe.weight"][:steps]
    real = tokens != PAD_ID  # [n, L]
    causal = torch.tril(torch.ones(steps, steps, dtype=torch.bool))
    allowed = (causal & real[:, None, :]) | torch.eye(steps, dtype=torch.bool)  # [n, query, key]
    for i in range(layers):
        b = f"{e}h.{i}."
        qkv = conv1d(layer_norm(x, p, b + "ln_1"), p, b + "attn.c_attn")
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        q, k, v = (t.reshape(n, steps, heads, hd).permute(0, 2, 1, 3) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [n, heads, L, L]
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        scores = scores - scores.max(-1, keepdim=True).values
        weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
        a = (weights @ v).permute(0, 2, 1, 3).reshape(n, steps, d)
        x = x + conv1d(a, p, b + "attn.c_proj")
        m = gelu_tanh(conv1d(layer_norm(x, p, b + "ln_2"), p, b + "mlp.c_fc"))
        x = x + conv1d(m, p, b + "mlp.c_proj")
    x = layer_norm(x, p, e + "ln_f")
    w = real[..., None].to(x.dtype)  # mean over the text positions only
    pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)
    return conv1d(pooled, p, e + "proj")


def recommender_loss(meta, p, inputs, targets):
    layers, heads = int(meta["encoder_layers"]), int(meta["encoder_heads"])
    depth = int(meta["mlp_depth"])
    with torch.no_grad():  # frozen: no gradient reaches the encoder
        item_meta = encode(p, p["item_text"].long(), layers, heads)  # [num_items, d_meta]
    inputs = inputs.long()
    users, items = inputs[:, 0], inputs[:, 1:]  # [n], [n, 2]
    x = torch.cat([p["item_embedding.weight"][items], item_meta[items]], -1)
    for i in range(depth + 1):
        x = linear(x, p, f"tower.{i}")
        if i != depth:
            x = gelu_erf(x)
    u = p["user_embedding.weight"][users]  # [n, d]
    scores = (x * u[:, None, :]).sum(-1)  # [n, 2]
    margin = scores[:, 0] - scores[:, 1]
    # BPR: -mean(log sigmoid(margin)), log sigmoid(m) = -log(1 + exp(-m)), written stably.
    log_sigmoid = (torch.minimum(margin, torch.zeros_like(margin))
                   - torch.log1p(torch.exp(-margin.abs())))
    return -log_sigmoid.mean()


if __name__ == "__main__":
    run(recommender_loss, __doc__)
