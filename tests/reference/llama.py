"""PyTorch reference for the `llama` model (Llama), written from the definition in
src/models/llama.h in plain tensor ops: RMSNorm, the rotary embedding (and Llama 3.1's frequency
scaling, from Meta's `apply_scaling`), grouped-query attention with its causal mask and softmax,
and the SwiGLU MLP are spelled out (no transformers, no scaled_dot_product_attention, no
nn.RMSNorm, no F.silu).

usage: python llama.py IN.safetensors OUT.safetensors

IN holds the parameters by the trainer's names (embed_tokens.weight,
layers.{i}.input_layernorm.weight, layers.{i}.self_attn.qkv_proj.weight (q_proj's rows, then
k_proj's, then v_proj's), layers.{i}.self_attn.o_proj.weight,
layers.{i}.post_attention_layernorm.weight, layers.{i}.mlp.{gate,up,down}_proj.weight, each
projection with .bias where the model has one, norm.weight, and lm_head.weight when the output
layer is untied) plus `inputs` and `targets` (int64 [n, T]; a target -100 is not counted) and,
for packed documents, `positions` (int64 [n, T]: each token's position within its document: the
rotary position, and token i attends token j iff j <= i and j >= i - positions[i]); its metadata
holds num_layers,
heads, kv_heads, head_dim, vocab_size, rms_norm_eps, rope_theta and, for the llama3 scaling,
rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_context (absent: no
scaling), as strings. OUT gets `loss` (0-dim, the mean cross-entropy over the counted targets on
the first vocab_size logits) and `grad.<name>` for every parameter. Float32, no dropout.
"""

import math

import torch
import torch.nn.functional as F
from reference_io import hidden, run


def linear(x, p, name):
    """torch.nn.Linear's layout: weight [out, in]; the bias only where the model has one."""
    y = x @ p[name + ".weight"].t()
    return y + p[name + ".bias"] if name + ".bias" in p else y


def rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def llama3_scaled(freqs, factor, low_freq_factor, high_freq_factor, original_context):
    """Meta's apply_scaling (Llama 3.1): long wavelengths slowed by `factor`, short ones kept,
    the band between blended linearly in original_context / wavelength."""
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_freq_wavelen:
            out.append(f)
        elif wavelen > low_freq_wavelen:
            out.append(f / factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


def rotary_tables(meta, head_dim, positions):
    """cos and sin [n, 1, T, head_dim]: at position p (positions [n, T]), frequency i at columns
    i and i + head_dim / 2, alike for every head."""
    theta = float(meta["rope_theta"])
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if "rope_factor" in meta:
        freqs = llama3_scaled(
            freqs,
            float(meta["rope_factor"]),
            float(meta["rope_low_freq_factor"]),
            float(meta["rope_high_freq_factor"]),
            float(meta["rope_original_context"]),
        )
    angles = positions.to(torch.float32)[..., None] * freqs  # [n, T, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return torch.cos(angles), torch.sin(angles)


def rotate(x, cos, sin):
    """Each head's first half paired with its second half (the Hugging Face layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention(x, p, name, meta, cos, sin, positions):
    n, steps, _ = x.shape
    heads, kv_heads, hd = int(meta["heads"]), int(meta["kv_heads"]), int(meta["head_dim"])
    qkv = linear(x, p, name + ".qkv_proj")  # q_proj's rows, then k_proj's, then v_proj's
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q = q.reshape(n, steps, heads, hd).permute(0, 2, 1, 3)
    k = k.reshape(n, steps, kv_heads, hd).permute(0, 2, 1, 3)
    v = v.reshape(n, steps, kv_heads, hd).permute(0, 2, 1, 3)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    group = heads // kv_heads  # query heads g*group .. g*group + group - 1 share kv head g
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [n, heads, T, T]
    scores = scores.masked_fill(hidden(positions), float("-inf"))  # within the document, causal
    a = torch.softmax(scores, dim=-1) @ v
    return linear(a.permute(0, 2, 1, 3).reshape(n, steps, heads * hd), p, name + ".o_proj")


def swiglu(x, p, name):
    gate = linear(x, p, name + ".gate_proj")
    return linear(
        gate * torch.sigmoid(gate) * linear(x, p, name + ".up_proj"), p, name + ".down_proj"
    )


def llama_loss(meta, p, inputs, targets, positions=None):
    tokens, targets = inputs.long(), targets.long()
    eps, vocab = float(meta["rms_norm_eps"]), int(meta["vocab_size"])
    if int(meta["heads"]) % int(meta["kv_heads"]) != 0:
        raise SystemExit(f"metadata {meta}: kv_heads must divide heads")
    if positions is None:  # one sequence per row
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
    cos, sin = rotary_tables(meta, int(meta["head_dim"]), positions)
    x = p["embed_tokens.weight"][tokens]
    for i in range(int(meta["num_layers"])):
        b = f"layers.{i}."
        x = x + attention(
            rms_norm(x, p[b + "input_layernorm.weight"], eps),
            p, b + "self_attn", meta, cos, sin, positions,
        )
        x = x + swiglu(rms_norm(x, p[b + "post_attention_layernorm.weight"], eps), p, b + "mlp")
    x = rms_norm(x, p["norm.weight"], eps)
    out = p["lm_head.weight"] if "lm_head.weight" in p else p["embed_tokens.weight"]  # tied
    logits = (x @ out.t())[..., :vocab]  # the padded rows are never predicted
    # The mean over the targets that are not -100 (ignore_index).
    return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)


if __name__ == "__main__":
    run(llama_loss, __doc__)
