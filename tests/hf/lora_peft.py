"""PEFT's side of the LoRA tests (tests/unit/lora_peft_test.cpp, tests/e2e). Offline: the base
models are random ones that tests/hf/hf_llama.py or hf_gpt2.py made.

usage:
  lora_peft.py check BASE ADAPTER IN OUT [--merged DIR]
      Loads BASE with AutoModelForCausalLM.from_pretrained and ADAPTER with
      peft.PeftModel.from_pretrained over it; fails unless the adapter's keys are exactly the
      PEFT model's adapter keys (none missing, none unexpected) with the file's values. Writes
      to OUT `logits` (the PEFT model's on IN's `inputs`) and, with --merged, `merged_diff`: the
      largest |difference| between merge_and_unload()'s weights and those DIR holds (the
      trainer's merged --export-hf, loaded with from_pretrained), and `merged_logits`.
  lora_peft.py make BASE ADAPTER IN OUT --r R --alpha A [--seed S] [--peft-type LORA|IA3]
      [--rslora] --targets T [T ...]
      A PEFT adapter over BASE with random A and B (init_lora_weights=False), saved with
      save_pretrained into ADAPTER; writes the PEFT model's `logits` on IN's `inputs` to OUT.
      --rslora: rank-stabilised (use_rslora, scale alpha / sqrt(r)). --peft-type IA3 writes an
      IA3 adapter instead (the trainer must refuse it).
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from peft import IA3Config, LoraConfig, PeftModel, get_peft_model  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()


def base_model(directory):
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    bad = {
        k: v
        for k, v in info.items()
        if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    if bad:
        sys.exit(f"{directory}: from_pretrained: {bad}")
    return model.eval()


def check(a):
    model = PeftModel.from_pretrained(base_model(a.base), a.adapter).eval()
    held = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    # PEFT's own view of its adapter keys (without the adapter's name, as save_pretrained
    # writes them) against the file's.
    mine = get_peft_model_state_dict(model)
    missing = sorted(set(mine) - set(held))
    unexpected = sorted(set(held) - set(mine))
    if missing or unexpected:
        sys.exit(f"{a.adapter}: missing keys {missing}, unexpected keys {unexpected}")
    for key, t in held.items():
        if not torch.equal(mine[key].float(), t.float()):
            sys.exit(f"{a.adapter}: {key} did not load as written")
    if all(not t.any() for k, t in held.items() if "lora_B" in k):
        sys.exit(f"{a.adapter}: every lora_B is zero: the check would not see the adapters")
    inputs = load_file(a.inp)["inputs"].long()
    out = {}
    with torch.no_grad():
        out["logits"] = model(inputs).logits.contiguous()
        if a.merged:
            merged = model.merge_and_unload().state_dict()
            theirs = base_model(a.merged)
            diff = 0.0
            for key, t in theirs.state_dict().items():
                diff = max(diff, (t.float() - merged[key].float()).abs().max().item())
            out["merged_diff"] = torch.tensor(diff, dtype=torch.float64)
            out["merged_logits"] = theirs(inputs).logits.contiguous()
    save_file(out, a.out)


def make(a):
    torch.manual_seed(a.seed)
    base = base_model(a.base)
    if a.peft_type == "IA3":
        config = IA3Config(task_type="CAUSAL_LM", target_modules=a.targets, feedforward_modules=[])
    else:
        config = LoraConfig(
            task_type="CAUSAL_LM",
            r=a.r,
            lora_alpha=a.alpha,
            target_modules=a.targets,
            lora_dropout=0.0,
            use_rslora=a.rslora,
            init_lora_weights=False,  # random B: the adapters change the logits
            fan_in_fan_out=base.config.model_type == "gpt2",
        )
    model = get_peft_model(base, config).eval()
    model.save_pretrained(a.adapter)
    inputs = load_file(a.inp)["inputs"].long()
    with torch.no_grad():
        save_file({"logits": model(inputs).logits.contiguous()}, a.out)


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    for name in ("base", "adapter", "inp", "out"):
        c.add_argument(name)
    c.add_argument("--merged", default=None)
    m = sub.add_parser("make")
    for name in ("base", "adapter", "inp", "out"):
        m.add_argument(name)
    m.add_argument("--r", type=int, required=True)
    m.add_argument("--alpha", type=float, required=True)
    m.add_argument("--targets", nargs="+", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--peft-type", choices=["LORA", "IA3"], default="LORA")
    m.add_argument("--rslora", action="store_true")
    a = p.parse_args()
    {"check": check, "make": make}[a.command](a)


if __name__ == "__main__":
    main()
