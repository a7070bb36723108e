#!/usr/bin/env python3
"""The same training run in PyTorch DistributedDataParallel (gloo on CPU, NCCL on a GPU): the peer
of the trainer in bench/compare_pytorch.sh. Launched like the trainer:

    mpirun -np 2 python bench/pytorch_peer.py gpt --data data/tokens-sample --global-batch 32 ...

Rank and world size come from Open MPI's environment (OMPI_COMM_WORLD_*), or 0 and 1 alone.
Each rank trains on global_batch / world samples per step (one micro-batch, as the trainer does
when its micro-batch holds the whole slice), with AdamW and gradient clipping at 1.0, and prints

    peer: <model> ranks <W> steps <S> samples/s <X> loss <first> -> <last>

measured over the steps after the first (as the trainer's "done:" line is).
The models follow the trainer's definitions (src/models/gpt/gpt.h, llama/llama.h, sequence.h)
with PyTorch's own fast paths (F.scaled_dot_product_attention, nn.LSTM, fused AdamW where
available)."""

import argparse
import itertools
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, causal, dropout):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.causal, self.dropout = heads, causal, dropout

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, d))
        approx = "tanh" if self.causal else "none"
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate=approx))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, d):
        super().__init__()
        self.vocab = vocab
        padded = (vocab + 63) // 64 * 64
        self.wte, self.wpe = nn.Embedding(padded, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, heads, True, 0.0) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        # GPT-2's initialisation, as the trainer's (src/models/gpt/gpt.cpp): N(0, 0.02), the
        # residual output projections scaled by 1 / sqrt(2 layers), zero biases.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith("proj.weight") or name.endswith("out.weight")
                nn.init.normal_(p, 0.0, 0.02 / (2 * layers) ** 0.5 if residual else 0.02)

    def forward(self, tokens, targets):  # the loss (DDP wraps forward)
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(
            logits[..., : self.vocab].reshape(-1, self.vocab), targets.reshape(-1)
        )


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden, eps):
        super().__init__()
        self.hd, self.heads, self.kv = d // heads, heads, kv_heads
        self.norm_1, self.norm_2 = nn.RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.proj = nn.Linear(heads * self.hd, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.norm_1(x)).split(
            [self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], 2
        )
        q = rotary(q.view(n, t, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rotary(k.view(n, t, self.kv, self.hd).transpose(1, 2), cos, sin)
        v = v.view(n, t, self.kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv != self.heads
        )
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, self.heads * self.hd))
        h = self.norm_2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """The trainer's llama (src/models/llama/llama.h): RMSNorm, rotary, SwiGLU, grouped-query
    attention, no biases, the output layer tied to the embedding."""

    def __init__(self, vocab, layers, heads, kv_heads, d, hidden, theta=10000.0, eps=1e-5):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding((vocab + 63) // 64 * 64, d)
        self.layers = nn.ModuleList(
            LlamaBlock(d, heads, kv_heads, hidden, eps) for _ in range(layers)
        )
        self.norm = nn.RMSNorm(d, eps=eps)
        hd = d // heads
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd), persistent=False
        )
        for p in self.parameters():  # transformers' Llama initialisation, as the trainer's
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):  # the loss (DDP wraps forward)
        t = tokens.shape[1]
        angles = torch.outer(
            torch.arange(t, device=tokens.device, dtype=torch.float32), self.inv_freq
        )
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(tokens)
        for b in self.layers:
            x = b(x, cos, sin)
        logits = self.norm(x) @ self.embed.weight.t()
        return F.cross_entropy(
            logits[..., : self.vocab].reshape(-1, self.vocab), targets.reshape(-1)
        )


class Lstm(nn.Module):
    def __init__(self, features, hidden, layers, horizon, targets, dropout):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, horizon * targets)
        self.horizon, self.targets = horizon, targets

    def forward(self, x, y):  # the loss (DDP wraps forward)
        out, _ = self.lstm(x)
        pred = self.head(out[:, -1]).view(-1, self.horizon, self.targets)
        return F.mse_loss(pred, y)


class Mlp(nn.Module):
    def __init__(self, inputs, hidden, depth, classes):
        super().__init__()
        widths = [inputs] + [hidden] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x, y):  # the loss (DDP wraps forward)
        for layer in self.hidden:
            x = F.gelu(layer(x))
        return F.cross_entropy(self.head(x), y)


def synthetic_batches(inputs, classes, n, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(n, inputs, generator=g), torch.randint(classes, (n,), generator=g)


def token_batches(path, context, n, seed):
    files = sorted(
        os.path.join(path, f) for f in os.listdir(path) if f.endswith(".bin") and "val" not in f
    )
    data = []
    for f in files:
        raw = np.memmap(f, dtype=np.uint16, mode="r")
        if len(raw) >= 512 and np.frombuffer(raw[:4].tobytes(), dtype=np.int32)[0] == 20240520:
            raw = raw[512:]
        data.append(raw)
    rng = np.random.default_rng(seed)
    while True:
        out = np.empty((n, context + 1), dtype=np.int64)
        for i in range(n):
            d = data[rng.integers(len(data))]
            s = rng.integers(0, len(d) - context - 1)
            out[i] = d[s : s + context + 1]
        t = torch.from_numpy(out)
        yield t[:, :-1], t[:, 1:]


def series_batches(path, features, targets, window, horizon, n, seed):
    import csv

    with open(path) as f:
        rows = list(csv.reader(f))
    header = rows[0]
    cols = [header.index(c) for c in features]
    tcols = [header.index(c) for c in targets]
    values = np.array(
        [[float(r[c]) for c in cols + tcols] for r in rows[1:] if r], dtype=np.float32
    )
    values = (values - values.mean(0)) / (values.std(0) + 1e-8)
    x_all, y_all = (
        torch.from_numpy(values[:, : len(cols)]),
        torch.from_numpy(values[:, len(cols) :]),
    )
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(values) - window - horizon, size=n)
        x = torch.stack([x_all[s : s + window] for s in starts])
        y = torch.stack([y_all[s + window : s + window + horizon] for s in starts])
        yield x, y


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model", choices=["gpt", "llama", "lstm", "mlp"])
    p.add_argument("--data", default="", help="gpt: a directory of token shards; lstm: a CSV file")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0, help="0: cores / ranks")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: forward and loss under torch.autocast, as the trainer's train.precision",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--trace",
        default="",
        help="directory for a torch.profiler trace of steps 3-7 "
        "(trace_rank<R>.json, the phases named as the trainer's log.profile trace)",
    )
    # gpt
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    # llama (and the gpt keys above)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=688)
    # mlp (random inputs: speed only)
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=512)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--classes", type=int, default=16)
    # lstm
    p.add_argument("--features", default="")
    p.add_argument("--targets", default="")
    p.add_argument("--window", type=int, default=48)
    p.add_argument("--horizon", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lstm-layers", type=int, default=2)
    a = p.parse_args()

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(a.threads or max(1, os.cpu_count() // local))
    device = torch.device(a.device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world
    )
    torch.manual_seed(1234)
    per_rank = a.global_batch // world + (1 if rank < a.global_batch % world else 0)
    if a.model == "gpt":
        model = Gpt(a.vocab, a.context, a.layers, a.heads, a.d_model)
        batches = token_batches(a.data, a.context, per_rank, 1000 + rank)
    elif a.model == "llama":
        model = Llama(a.vocab, a.layers, a.heads, a.kv_heads, a.d_model, a.intermediate)
        batches = token_batches(a.data, a.context, per_rank, 1000 + rank)
    elif a.model == "mlp":
        model = Mlp(a.inputs, a.hidden_dim, a.depth, a.classes)
        batches = synthetic_batches(a.inputs, a.classes, per_rank, 1000 + rank)
    else:
        model = Lstm(
            len(a.features.split(",")),
            a.hidden,
            a.lstm_layers,
            a.horizon,
            len(a.targets.split(",")),
            0.0,
        )
        batches = series_batches(
            a.data,
            a.features.split(","),
            a.targets.split(","),
            a.window,
            a.horizon,
            per_rank,
            1000 + rank,
        )
    model.to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the trainer's train.tf32 auto on Ampere+
        torch.backends.cudnn.allow_tf32 = True
    ddp = nn.parallel.DistributedDataParallel(model)
    if a.compile:
        ddp = torch.compile(ddp)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    losses, start, prof = [], None, None
    phase = torch.profiler.record_function
    for step in range(a.steps):
        if step == 1:
            dist.barrier()
            start = time.perf_counter()
        if a.trace and step == 2:  # the trainer's log.profile_from 3 (1-based)
            kinds = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":  # the kernels too, as the trainer's log.profile on CUDA
                kinds.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=kinds)
            prof.__enter__()
        with phase("step/data"):
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with (
            phase("step/forward"),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"),
        ):
            loss = ddp(x, y)  # DDP averages the gradients over ranks
        with phase("step/zero_grad"):
            opt.zero_grad(set_to_none=False)
        with phase("step/backward"):  # DDP's all-reduce overlaps it
            loss.backward()
        with phase("step/clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with phase("step/optimizer"):
            opt.step()
        losses.append(loss.item())
        if prof is not None and step == 6:
            prof.__exit__(None, None, None)
            os.makedirs(a.trace, exist_ok=True)
            prof.export_chrome_trace(os.path.join(a.trace, f"trace_rank{rank}.json"))
            prof = None
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        sps = (a.steps - 1) * a.global_batch / elapsed
        tokens = f" {sps * a.context:.0f} tokens/s" if a.model in ("gpt", "llama") else ""
        print(
            f"peer: {a.model} ranks {world} steps {a.steps} samples/s {sps:.1f}{tokens} "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
