#!/usr/bin/env python3
"""The same training run in plain PyTorch (gloo on CPU, NCCL on a GPU): the peer of the trainer
in bench/compare_pytorch.sh and bench/gpu_lm.sh, written as a PyTorch user would write it for
speed. Launched like the trainer, under mpirun (or torchrun):

    mpirun -np 2 python bench/pytorch_peer.py gpt --data data/tokens-sample --global-batch 32 ...

Rank and world size come from Open MPI's environment (OMPI_COMM_WORLD_*), torchrun's (RANK,
WORLD_SIZE, ...), or 0 and 1 alone. Each rank trains on global_batch / world samples per step (one
micro-batch, as the trainer does when its micro-batch holds the whole slice), with AdamW fused
where PyTorch has the kernel and gradient-norm clipping, as the trainer's. How it runs:

- one process: no DDP wrapper; more: DDP (--bucket-mb: 25 MB buckets, as the trainer's), and
  with --compile the model compiled first and then wrapped (nanoGPT's order) unless
  --ddp-order wrap-then-compile;
- no host synchronisation in the step (the loss stays on the device until the end; batches
  come from pinned memory on CUDA);
- --warmup steps (10) untimed, then --rounds (3) timed rounds of --steps (30) steps, each
  between a device synchronisation and a barrier; the median round is reported:

    peer-setup: <how it ran, in words>
    peer: <model> ranks <W> steps <warmup>+<rounds>x<steps> samples/s <X> [<T> tokens/s]
        loss <first> -> <last> rounds <samples/s of each round>

The models follow the trainer's definitions (src/models/gpt/gpt.h, llama/llama.h, sequence.h)
with PyTorch's own fast paths (F.scaled_dot_product_attention, nn.LSTM), the vocabulary padded
to a multiple of 64 as the trainer's."""

import argparse
import contextlib
import functools
import itertools
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def padded_vocab(vocab):
    """The embedding's and output layer's rows, as the trainer's padded_vocab
    (src/models/lm/causal_lm.cpp): a multiple of 64. The loss runs over the real vocabulary."""
    return (vocab + 63) // 64 * 64


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
        self.wte, self.wpe = nn.Embedding(padded_vocab(vocab), d), nn.Embedding(context, d)
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
        self.embed = nn.Embedding(padded_vocab(vocab), d)
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


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model", choices=["gpt", "llama", "lstm", "mlp"])
    p.add_argument("--data", default="", help="gpt, llama: a folder of token shards; lstm: a CSV")
    p.add_argument("--global-batch", type=positive, required=True)
    p.add_argument("--steps", type=positive, default=30, help="timed steps per round")
    p.add_argument("--warmup", type=positive, default=10, help="untimed steps before the rounds")
    p.add_argument("--rounds", type=positive, default=3, help="timed rounds; the median is kept")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping (0: none)")
    p.add_argument("--threads", type=int, default=0, help="0: cores / ranks")
    p.add_argument("--device", default="cpu", help="cpu or cuda (each rank its local rank's GPU)")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: forward and loss under torch.autocast, as the trainer's train.precision",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--ddp-order",
        choices=["compile-then-wrap", "wrap-then-compile"],
        default="compile-then-wrap",
        help="with --compile at more than one rank: DDP(torch.compile(model)), nanoGPT's order "
        "(default), or torch.compile(DDP(model)), whose graph breaks at every bucket",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=25.0,
        help="DDP's bucket_cap_mb (25: PyTorch's default and the trainer's ddp.bucket_mb)",
    )
    p.add_argument(
        "--trace",
        default="",
        help="directory for a torch.profiler trace of 5 untimed steps after the warm-up "
        "(trace_rank<R>.json, the phases named as the trainer's log.profile trace)",
    )
    # gpt
    p.add_argument("--context", type=positive, default=64)
    p.add_argument("--vocab", type=positive, default=256)
    p.add_argument("--layers", type=positive, default=2)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--d-model", type=positive, default=64)
    # llama (and the gpt keys above)
    p.add_argument("--kv-heads", type=positive, default=4)
    p.add_argument("--intermediate", type=positive, default=688)
    # mlp (random inputs: speed only)
    p.add_argument("--inputs", type=positive, default=64)
    p.add_argument("--hidden-dim", type=positive, default=512)
    p.add_argument("--depth", type=positive, default=3)
    p.add_argument("--classes", type=positive, default=16)
    # lstm
    p.add_argument("--features", default="")
    p.add_argument("--targets", default="")
    p.add_argument("--window", type=positive, default=48)
    p.add_argument("--horizon", type=positive, default=1)
    p.add_argument("--hidden", type=positive, default=64)
    p.add_argument("--lstm-layers", type=positive, default=2)
    a = p.parse_args()
    if a.model in ("gpt", "llama"):
        if not os.path.isdir(a.data):
            p.error(f"{a.model}: --data '{a.data}' is not a directory of token shards (*.bin)")
        if not any(f.endswith(".bin") and "val" not in f for f in os.listdir(a.data)):
            p.error(f"{a.model}: --data '{a.data}' holds no training shard (*.bin, not val*)")
    if a.model == "lstm" and not (os.path.isfile(a.data) and a.features and a.targets):
        p.error("lstm: --data CSV, --features and --targets (comma-separated columns) are needed")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this PyTorch sees no CUDA device")
    return a


def launch():
    """(rank, world size, local rank, ranks on this node): Open MPI's environment under mpirun,
    torchrun's, or one process."""
    ompi = "OMPI_COMM_WORLD_"
    for names in (
        (ompi + "RANK", ompi + "SIZE", ompi + "LOCAL_RANK", ompi + "LOCAL_SIZE"),
        ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ):
        if names[0] in os.environ and names[1] in os.environ:
            rank, world, local, local_size = (os.environ.get(n) for n in names)
            return int(rank), int(world), int(local or rank), int(local_size or world)
    return 0, 1, 0, 1


def build(a, rank, per_rank):
    """The model and its batches (this rank's share of the global batch)."""
    if a.model == "gpt":
        model = Gpt(a.vocab, a.context, a.layers, a.heads, a.d_model)
        return model, token_batches(a.data, a.context, per_rank, 1000 + rank)
    if a.model == "llama":
        model = Llama(a.vocab, a.layers, a.heads, a.kv_heads, a.d_model, a.intermediate)
        return model, token_batches(a.data, a.context, per_rank, 1000 + rank)
    if a.model == "mlp":
        model = Mlp(a.inputs, a.hidden_dim, a.depth, a.classes)
        return model, synthetic_batches(a.inputs, a.classes, per_rank, 1000 + rank)
    features, targets = a.features.split(","), a.targets.split(",")
    model = Lstm(len(features), a.hidden, a.lstm_layers, a.horizon, len(targets), 0.0)
    batches = series_batches(a.data, features, targets, a.window, a.horizon, per_rank, 1000 + rank)
    return model, batches


def wrap(model, a, world, device):
    """What the step calls, and how it runs, in words. The best a PyTorch user gets: no DDP at
    one rank; at more, DDP around the compiled model (nanoGPT's order) unless --ddp-order says
    otherwise."""
    if world == 1:
        if a.compile:
            return torch.compile(model), "torch.compile, no DDP (one process)"
        return model, "eager, no DDP (one process)"
    ids = [device.index] if device.type == "cuda" else None
    ddp = functools.partial(
        nn.parallel.DistributedDataParallel, device_ids=ids, bucket_cap_mb=a.bucket_mb
    )
    what = f"DDP ({dist.get_backend()}, {a.bucket_mb:g} MB buckets)"
    if not a.compile:
        return ddp(model), f"eager, {what}"
    if a.ddp_order == "compile-then-wrap":
        return ddp(torch.compile(model)), f"torch.compile then {what}, nanoGPT's order"
    return torch.compile(ddp(model)), f"{what} then torch.compile (graph split at each bucket)"


def adamw(params, a):
    """The trainer's optimizer: AdamW in one fused kernel (train/optimizer.cpp's FusedAdamW)."""
    hyper = dict(lr=a.lr, betas=(0.9, a.beta2), weight_decay=a.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **hyper), "AdamW fused"
    except (RuntimeError, TypeError) as e:  # no fused kernel for this device
        reason = str(e).splitlines()[0]
        return torch.optim.AdamW(params, **hyper), f"AdamW foreach (not fused: {reason})"


def main():
    a = parse_args()
    rank, world, local, local_size = launch()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(a.threads or max(1, os.cpu_count() // local_size))
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", local if device.index is None else device.index)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # the trainer's train.tf32 auto on Ampere+
        torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world
        )
    per_rank = a.global_batch // world + (1 if rank < a.global_batch % world else 0)
    if per_rank == 0:
        raise SystemExit(f"pytorch_peer.py: --global-batch {a.global_batch} < {world} ranks")
    torch.manual_seed(1234)
    model, batches = build(a, rank, per_rank)
    model.to(device)
    forward, how = wrap(model, a, world, device)
    opt, how_opt = adamw(model.parameters(), a)
    params = list(model.parameters())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")
    pinned = device.type == "cuda"
    phase = contextlib.nullcontext  # torch.profiler.record_function while tracing (step reads it)

    # The step: nothing in it waits for the device. The batch comes from pinned memory without
    # blocking, the gradient norm and the clipping stay on the device (clip_grad_norm_ returns a
    # tensor), the fused AdamW reads its step count from a device tensor, and the loss is kept as
    # a tensor, read once after the rounds.
    def step():
        with phase("step/data"):
            x, y = next(batches)
            if pinned:
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with phase("step/forward"), autocast:
            loss = forward(x, y)  # DDP averages the gradients over ranks in backward
        with phase("step/backward"):
            loss.backward()
        if a.clip > 0:
            with phase("step/clip"):
                torch.nn.utils.clip_grad_norm_(params, a.clip)
        with phase("step/optimizer"):
            opt.step()
        with phase("step/zero_grad"):
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()

    first = step()  # compiles under --compile
    for _ in range(a.warmup - 1):
        last = step()
    if a.trace:  # untimed, after the warm-up
        kinds = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":  # the kernels too, as the trainer's log.profile on CUDA
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        phase = torch.profiler.record_function
        with torch.profiler.profile(activities=kinds) as prof:
            for _ in range(5):
                last = step()
        phase = contextlib.nullcontext
        os.makedirs(a.trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(a.trace, f"trace_rank{rank}.json"))
    rates = []
    for _ in range(a.rounds):
        sync()
        start = time.perf_counter()
        for _ in range(a.steps):
            last = step()
        sync()
        rates.append(a.steps * a.global_batch / (time.perf_counter() - start))
    sps = statistics.median(rates)
    if rank == 0:
        precision = {"bf16": "bf16 autocast", "fp32": "fp32"}[a.precision]
        if a.precision == "fp32" and device.type == "cuda":
            precision += " (TF32 matmuls)"
        setup = [how, precision]
        if a.model in ("gpt", "llama"):
            setup.append(f"vocabulary {a.vocab} padded to {padded_vocab(a.vocab)}")
        setup.append(how_opt)
        setup.append(f"clip {a.clip:g}" if a.clip > 0 else "no clipping")
        timed = f"median of {a.rounds} rounds" if a.rounds > 1 else "1 round"
        setup.append(
            f"{a.warmup} warm-up steps untimed, {timed} of {a.steps} steps, "
            "no host sync in the step"
        )
        print("peer-setup: " + ", ".join(setup), flush=True)
        tokens = f" {sps * a.context:.0f} tokens/s" if a.model in ("gpt", "llama") else ""
        print(
            f"peer: {a.model} ranks {world} steps {a.warmup}+{a.rounds}x{a.steps} "
            f"samples/s {sps:.1f}{tokens} loss {first.item():.4f} -> {last.item():.4f} "
            f"rounds {' '.join(f'{r:.1f}' for r in rates)}",
            flush=True,
        )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
