"""PyTorch reference for LoRA adapters on the `llama` and `gpt` models (src/models/lm/lora.h),
written from LoRA's definition: an adapted layer's output W x + b gains scale * B (A x), scale =
lora_alpha / lora_rank, with A [rank, in] and B [rows, rank]. llama's q_proj, k_proj and v_proj
adapt their rows of the fused qkv_proj (q's rows, then k's, then v's). No dropout.

usage: python lora.py IN.safetensors OUT.safetensors

IN holds the adapters by the trainer's names (layers.{i}.self_attn.q_proj.lora_A.weight,
h.{i}.attn.c_attn.lora_B.weight, ...) as parameters, the frozen base as `frozen.<name>` (the
names llama.py and gpt.py read), `inputs` and `targets`; its metadata holds what llama.py or
gpt.py needs, plus `family` (llama | gpt), `lora_rank` and `lora_alpha`. OUT gets `loss` and
`grad.<name>` for every adapter (reference_io.run).
"""

import gpt
import llama
import torch
from reference_io import run

SCALE = {}  # lora_alpha / lora_rank, set from the metadata before the loss runs


def delta(x, p, name):
    """scale * B (A x) for the adapter `name`, or None without one."""
    if name + ".lora_A.weight" not in p:
        return None
    return (x @ p[name + ".lora_A.weight"].t()) @ p[name + ".lora_B.weight"].t() * SCALE["s"]


def adapted(base_linear, split):
    """`base_linear` with each adapter added; `split` maps a fused layer's name to its parts'
    names and rows."""

    def linear(x, p, name):
        y = base_linear(x, p, name)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in split:
            parent = name.rsplit(".", 1)[0]
            parts = []
            for part, rows in split[leaf](y.shape[-1]):
                d = delta(x, p, parent + "." + part)
                parts.append(d if d is not None else y.new_zeros(*y.shape[:-1], rows))
            return y + torch.cat(parts, dim=-1)
        d = delta(x, p, name)
        return y if d is None else y + d

    return linear


def lora_loss(meta, p, inputs, targets, positions=None):
    SCALE["s"] = float(meta["lora_alpha"]) / float(meta["lora_rank"])
    if meta["family"] == "llama":
        heads, kv, hd = int(meta["heads"]), int(meta["kv_heads"]), int(meta["head_dim"])
        qkv = {
            "qkv_proj": lambda _: [("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)]
        }
        llama.linear = adapted(llama.linear, qkv)
        return llama.llama_loss(meta, p, inputs, targets, positions)
    gpt.linear = adapted(gpt.linear, {})
    return gpt.gpt_loss(meta, p, inputs, targets, positions)


if __name__ == "__main__":
    run(lora_loss, __doc__)
