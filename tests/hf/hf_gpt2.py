"""Hugging Face `transformers` side of the GPT-2 import/export tests (tests/unit/hf_gpt2_test.cpp,
tests/e2e/language_models.sh). Offline: nothing is downloaded; models are random.

usage:
  hf_gpt2.py make DIR --vocab V --layers L --heads H --width D --positions P [--seed S]
      A random GPT2LMHeadModel saved with save_pretrained (config.json + model.safetensors), and
      DIR/expected.safetensors: `inputs` int64 [2, P/2], their `logits` [2, P/2, V], `prompt`
      int64 [1, 5] and `greedy`, generate(do_sample=False)'s new ids after it (P/2 of them).
  hf_gpt2.py logits DIR IN OUT
      Loads DIR with GPT2LMHeadModel.from_pretrained (failing on missing or unexpected keys)
      and writes the logits of IN's `inputs` to OUT as `logits`.
  hf_gpt2.py greedy DIR PROMPT N
      Prints the bytes generate(do_sample=False) adds to the UTF-8 bytes of PROMPT (a byte-level
      model), N new ids, to stdout.
  hf_gpt2.py loss DIR SHARD CONTEXT
      Prints the mean next-token loss of the model over every window of CONTEXT + 1 tokens of the
      uint16 SHARD, windows starting at multiples of CONTEXT (the trainer's samples).
  hf_gpt2.py shard FILE N VOCAB [--seed S]
      Writes N uint16 token ids below VOCAB (a repeating pattern with noise: learnable) to FILE.
  hf_gpt2.py check-export DIR CHECKPOINT
      From_pretrained(DIR)'s logits against a GPT2LMHeadModel whose state dict is mapped here,
      independently of the C++ exporter, from the trainer CHECKPOINT's parameters (Conv1D
      transposes, the padded rows of wte cut); max difference below 1e-4.
"""
import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_loss import shard_loss  # noqa: E402

hf_logging.disable_progress_bar()
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def load(directory):
    model, info = GPT2LMHeadModel.from_pretrained(directory, output_loading_info=True)
    bad = {k: v for k, v in info.items()
           if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        sys.exit(f"{directory}: from_pretrained: {bad}")
    return model.eval()


def make(a):
    torch.manual_seed(a.seed)
    # A wider initialisation than GPT-2's 0.02 gives peaked logits, so greedy choices are not
    # decided by rounding.
    config = GPT2Config(vocab_size=a.vocab, n_layer=a.layers, n_head=a.heads, n_embd=a.width,
                        n_positions=a.positions, initializer_range=0.1,
                        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(a.dir, safe_serialization=True)
    steps = a.positions // 2
    g = torch.Generator().manual_seed(a.seed + 1)
    inputs = torch.randint(0, a.vocab, (2, steps), generator=g)
    prompt = torch.randint(0, a.vocab, (1, 5), generator=g)
    with torch.no_grad():
        logits = model(inputs).logits
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=steps, min_new_tokens=steps, pad_token_id=0)
    save_file({"inputs": inputs, "logits": logits.contiguous(), "prompt": prompt,
               "greedy": out[0, prompt.shape[1]:].contiguous()},
              os.path.join(a.dir, "expected.safetensors"))


def logits(a):
    model = load(a.dir)
    inputs = load_file(a.inp)["inputs"].long()
    with torch.no_grad():
        save_file({"logits": model(inputs).logits.contiguous()}, a.out)


def greedy(a):
    model = load(a.dir)
    prompt = torch.tensor([list(a.prompt.encode())])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=a.n, min_new_tokens=a.n, pad_token_id=0)
    sys.stdout.buffer.write(a.prompt.encode() + bytes(out[0, prompt.shape[1]:].tolist()) + b"\n")


def loss(a):
    value, windows = shard_loss(load(a.dir), a.shard, a.context)
    print(f"{value:.6f} over {windows} windows")


def shard(a):
    rng = np.random.default_rng(a.seed)
    pattern = rng.integers(0, a.vocab, 97)
    ids = np.resize(pattern, a.n)
    noise = rng.random(a.n) < 0.05
    ids[noise] = rng.integers(0, a.vocab, int(noise.sum()))
    ids.astype(np.uint16).tofile(a.file)


def check_export(a):
    exported = load(a.dir)
    config = exported.config
    params = {k[len("param."):]: v for k, v in load_file(a.checkpoint).items()
              if k.startswith("param.")}
    state = {}
    for name, w in params.items():
        if name.endswith(CONV1D):
            w = w.t()
        if name == "wte.weight":
            w = w[:config.vocab_size]
        state["transformer." + name] = w.contiguous()
    mapped = GPT2LMHeadModel(config).eval()
    missing, unexpected = mapped.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to wte
    if missing or unexpected:
        sys.exit(f"checkpoint {a.checkpoint}: missing {missing}, unexpected {unexpected}")
    mapped.tie_weights()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, config.vocab_size, (2, config.n_positions), generator=g)
    with torch.no_grad():
        diff = (exported(inputs).logits - mapped(inputs).logits).abs().max().item()
    print(f"max |logits difference| {diff:.3g}")
    if not diff < 1e-4:
        sys.exit(f"{a.dir}: logits differ from the checkpoint's by {diff}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for key in ("vocab", "layers", "heads", "width", "positions"):
        m.add_argument("--" + key, type=int, required=True)
    m.add_argument("--seed", type=int, default=0)
    lg = sub.add_parser("logits")
    lg.add_argument("dir")
    lg.add_argument("inp")
    lg.add_argument("out")
    gr = sub.add_parser("greedy")
    gr.add_argument("dir")
    gr.add_argument("prompt")
    gr.add_argument("n", type=int)
    ls = sub.add_parser("loss")
    ls.add_argument("dir")
    ls.add_argument("shard")
    ls.add_argument("context", type=int)
    sh = sub.add_parser("shard")
    sh.add_argument("file")
    sh.add_argument("n", type=int)
    sh.add_argument("vocab", type=int)
    sh.add_argument("--seed", type=int, default=0)
    ce = sub.add_parser("check-export")
    ce.add_argument("dir")
    ce.add_argument("checkpoint")
    a = p.parse_args()
    {"make": make, "logits": logits, "greedy": greedy, "loss": loss, "shard": shard,
     "check-export": check_export}[a.command](a)


if __name__ == "__main__":
    main()
