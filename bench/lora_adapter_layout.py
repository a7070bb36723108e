"""The q, k and v adapters of a fused qkv projection: one GEMM over a block-diagonal B against one
GEMM per adapter into its own rows (issue 52, item 3).

The trainer's LoraAddmm (src/models/block.cpp) adds scale * (x A^T) B^T into the projection's
output with the three B matrices block-diagonal, [out, 3r]: one GEMM each way, two thirds of its
multiplications by zeros. The other layout gives each adapter its GEMM on its rows (a column
slice of the output, and of d out in the backward): a third of the multiplications, three GEMMs.
Both are written here from that definition, forward and backward as LoraAddmm's (d middle and d B;
d A and d x are the same GEMMs either way and are left out), and timed side by side, alternated,
the median of ROUNDS.

    python bench/lora_adapter_layout.py [--device cpu|cuda] [--tokens N] [--rank R] [--rounds K]

On CUDA the operands are bf16 and d B is written in float32 (as adapter_weight_gradient's GEMM).
"""

import argparse
import statistics
import time

import torch

# name: (d_model, q rows, k and v rows each): the kv heads' width under grouped-query attention.
SHAPES = {
    "llama-25m": (512, 512, 256),
    "smollm-135m": (576, 576, 192),
    "llama-3.2-1b": (2048, 2048, 512),
}


def operands(d, rows, tokens, rank, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    out = sum(rows)
    return {
        "y": rand(tokens, out),
        "middle": rand(tokens, rank * len(rows)),
        "bs": [rand(k, rank) for k in rows],
        "dout": rand(tokens, out),
        "rows": rows,
        "rank": rank,
    }


def block_diagonal(o, db_dtype):
    b = torch.block_diag(*o["bs"])
    out = torch.addmm(o["y"], o["middle"], b.t(), alpha=2.0)
    dmiddle = (o["dout"] @ b).mul_(2.0)
    db = (o["dout"].t() @ o["middle"]).to(db_dtype).mul_(2.0)
    # The block-diagonal B's gradient, cut back into each adapter's [rows, r].
    r, at, dbs = o["rank"], 0, []
    for i, k in enumerate(o["rows"]):
        dbs.append(db[at : at + k, i * r : (i + 1) * r])
        at += k
    return out, dmiddle, dbs


def per_adapter(o, db_dtype):
    r, y, dout, middle = o["rank"], o["y"], o["dout"], o["middle"]
    out = torch.empty_like(y)
    dmiddle = torch.empty_like(middle)
    at, dbs = 0, []
    for i, (k, b) in enumerate(zip(o["rows"], o["bs"], strict=True)):
        m_i = middle[:, i * r : (i + 1) * r]
        torch.addmm(y[:, at : at + k], m_i, b.t(), alpha=2.0, out=out[:, at : at + k])
        d_i = dmiddle[:, i * r : (i + 1) * r]
        torch.addmm(d_i, dout[:, at : at + k], b, beta=0, alpha=2.0, out=d_i)
        dbs.append((dout[:, at : at + k].t() @ m_i).to(db_dtype).mul_(2.0))
        at += k
    return out, dmiddle, dbs


def timed(fn, o, db_dtype, device, repeats):
    for _ in range(5):
        fn(o, db_dtype)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(o, db_dtype)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tokens", type=int, default=None, help="micro-batch x context")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    tokens = args.tokens or (16384 if cuda else 1024)
    repeats = args.repeats or (200 if cuda else 50)
    print(f"device {args.device} ({torch.get_num_threads()} threads), {dtype}, tokens {tokens}, "
          f"rank {args.rank}; microseconds for forward + backward, median of {args.rounds}")
    print("| shape | block-diagonal B | one GEMM per adapter | per adapter / block-diagonal |")
    print("|---|---:|---:|---:|")
    for name, (d, q, kv) in SHAPES.items():
        o = operands(d, (q, kv, kv), tokens, args.rank, args.device, dtype)
        # The two agree (float32 on the CPU: to rounding; bf16: to bf16's).
        a, b = block_diagonal(o, torch.float32), per_adapter(o, torch.float32)
        for x, z in zip([a[0], a[1], *a[2]], [b[0], b[1], *b[2]], strict=True):
            err = ((x.float() - z.float()).norm() / z.float().norm()).item()
            assert err < (2e-2 if cuda else 1e-5), f"{name}: the layouts disagree ({err:.1e})"
        times = {"block": [], "per": []}
        for _ in range(args.rounds):
            times["block"].append(timed(block_diagonal, o, torch.float32, args.device, repeats))
            times["per"].append(timed(per_adapter, o, torch.float32, args.device, repeats))
        block, per = statistics.median(times["block"]), statistics.median(times["per"])
        print(f"| {name} | {block:.1f} | {per:.1f} | {per / block:.2f} |")


if __name__ == "__main__":
    main()
