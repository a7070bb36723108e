"""PyTorch reference for train.optimizer: muon (src/train/muon.h): torch.optim.Muon over the
hidden matrices and torch.optim.AdamW (fused, as the trainer's FusedAdamW) over every other
parameter, stepped with the gradients the trainer's optimizer received.

usage: python muon.py IN.safetensors OUT.safetensors

IN holds "init.<name>" (the parameters before step 1) and "grad.<s>.<name>" (the gradients the
trainer's optimizer consumed at step s = 1 .. steps, after clipping); its metadata: steps, the
names of the Muon matrices (muon, comma-separated), each step's learning rates (adamw_lr.<s>,
muon_lr.<s>), AdamW's beta1, beta2, eps, weight_decay, Muon's muon_weight_decay, momentum,
nesterov, ns_steps, adjust_lr_fn, and threads (torch.set_num_threads, as the trainer's: the
bf16 Newton-Schulz matmuls block by it). OUT gets "param.<name>" after the last step,
"momentum.<name>" for the Muon matrices and "exp_avg.<name>", "exp_avg_sq.<name>" for the rest.

With hf_model (a directory of a Hugging Face model, save_pretrained's, untied) in the metadata,
the parameters are that model's (its names, from_pretrained's values) instead of IN's "init.*",
and the Muon matrices those torch.optim.Muon takes over it as Hugging Face lays it out: the 2-D
weights of its layers ("model.layers.*", q_proj, k_proj and v_proj each a matrix of its own);
the gradients are then by those names too.
"""
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def hf_start(model_dir):
    """The parameters of the Hugging Face model in model_dir by name, and the names of its
    layers' 2-D weights."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    return start, {n for n, p in start.items() if n.startswith("model.layers.") and p.dim() == 2}


def main(path_in, path_out):
    with safe_open(path_in, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    torch.set_num_threads(int(meta["threads"]))
    if "hf_model" in meta:
        start, muon_names = hf_start(meta["hf_model"])
    else:
        start = {k[len("init."):]: t for k, t in tensors.items() if k.startswith("init.")}
        muon_names = set(meta["muon"].split(","))
    names = sorted(start)
    params = {n: torch.nn.Parameter(start[n].clone()) for n in names}
    muon = torch.optim.Muon(
        [params[n] for n in names if n in muon_names], lr=0.0,
        weight_decay=float(meta["muon_weight_decay"]), momentum=float(meta["momentum"]),
        nesterov=meta["nesterov"] == "true", ns_steps=int(meta["ns_steps"]),
        adjust_lr_fn=meta["adjust_lr_fn"])
    adamw = torch.optim.AdamW(
        [params[n] for n in names if n not in muon_names], lr=0.0,
        betas=(float(meta["beta1"]), float(meta["beta2"])), eps=float(meta["eps"]),
        weight_decay=float(meta["weight_decay"]), fused=True)
    for s in range(1, int(meta["steps"]) + 1):
        for n in names:
            params[n].grad = tensors[f"grad.{s}.{n}"].clone()
        for group in muon.param_groups:
            group["lr"] = float(meta[f"muon_lr.{s}"])
        for group in adamw.param_groups:
            group["lr"] = float(meta[f"adamw_lr.{s}"])
        muon.step()
        adamw.step()
    out = {"param." + n: p.detach().contiguous() for n, p in params.items()}
    for n in names:
        state = (muon if n in muon_names else adamw).state[params[n]]
        if n in muon_names:
            out["momentum." + n] = state["momentum_buffer"].contiguous()
        else:
            out["exp_avg." + n] = state["exp_avg"].contiguous()
            out["exp_avg_sq." + n] = state["exp_avg_sq"].contiguous()
    save_file(out, path_out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
