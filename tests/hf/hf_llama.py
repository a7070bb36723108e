"""Hugging Face `transformers` side of the import/export tests of Llama and its kin (Qwen2, Qwen3,
Mistral, Gemma 3: tests/unit/hf_llama_test.cpp, tests/unit/hf_kin_test.cpp, tests/e2e). Offline:
nothing is downloaded; models are random.

usage:
  hf_llama.py make DIR --vocab V --layers L --heads H --kv-heads K --width D --intermediate I
                       --positions P [--model-type llama|qwen2|qwen3|mistral|gemma3]
                       [--window W] [--head-dim HD] [--untied] [--rope-scaling] [--bias]
                       [--theta T] [--max-shard-size S] [--seed S] [--tokenizer FILE]
      A random LlamaForCausalLM (or Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM,
      Gemma3ForCausalLM; --window: a sliding window of W positions, on every layer for Mistral,
      on every other layer from the second for Qwen2 and Qwen3, from the first for Gemma 3, whose
      full-attention layers take --theta (and --rope-scaling: linear, factor 8) and its sliding
      ones theta 10000; Gemma's query_pre_attn_scalar is 20) saved with save_pretrained
      (config.json and model.safetensors, or shards and model.safetensors.index.json above S), and
      DIR/expected.safetensors: `inputs` int64 [2, P/2], their `logits` [2, P/2, V], `prompt`
      int64 [1, 5] and `greedy`, generate(do_sample=False)'s new ids after it (P/2 of them); and
      DIR/grads.safetensors: the `grads` command's output for `inputs`. With --tokenizer (a
      tokenizer.json of V ids), that tokenizer saved beside the weights by save_pretrained
      (PreTrainedTokenizerFast), and the output embeddings of its byte tokens (<0x00>..<0xFF>)
      zero, so that greedy decoding continues in whole characters, which transformers' decode
      writes byte for byte (it writes U+FFFD for a byte token that is not part of one).
  hf_llama.py logits DIR IN OUT
      Loads DIR with AutoModelForCausalLM.from_pretrained (failing on missing, unexpected or
      mismatched keys, and on a class other than config.json's architectures) and writes the
      logits of IN's `inputs` to OUT as `logits`.
  hf_llama.py grads DIR IN OUT
      The mean next-token loss of IN's `inputs` (labels = the inputs, as transformers shifts them)
      in float32 and its gradient: OUT holds `loss` and each parameter's gradient by its Hugging
      Face name.
  hf_llama.py greedy DIR PROMPT N
      Prints PROMPT and the bytes generate(do_sample=False) adds to its UTF-8 bytes (a byte-level
      model), N new ids, to stdout; with a tokenizer beside the weights (make --tokenizer), its
      decode of the prompt's ids (add_special_tokens=False) and the N new ones instead.
  hf_llama.py checkpoint-logits CKPT CONFIG_DIR IN OUT
      A LlamaForCausalLM of CONFIG_DIR's config.json with the parameters of the trainer's
      single-file checkpoint CKPT ("param.<name>", mapped here from the trainer's names: the fused
      qkv_proj split into q_proj, k_proj, v_proj, the padded vocabulary rows cut), and the logits
      of IN's `inputs`, written to OUT as `logits`.
  hf_llama.py close A B TOL
      Exits 1 unless A's and B's `logits` agree within TOL (max abs), printing the largest gap.
  hf_llama.py loss DIR SHARD CONTEXT
      The mean next-token loss of DIR's model over every window of CONTEXT + 1 tokens of SHARD
      (windows k * CONTEXT ..., as the trainer's token dataset cuts them), uint16 ids with or
      without llm.c's 256-int32 header; prints "LOSS over N windows".
"""

import argparse
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_loss import shard_loss  # noqa: E402

hf_logging.disable_progress_bar()


CONFIGS = {
    "llama": LlamaConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "mistral": MistralConfig,
    "gemma3": Gemma3TextConfig,
}


def load(directory):
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    wanted = model.config.architectures[0]
    if type(model).__name__ != wanted:
        sys.exit(f"{directory}: loaded as {type(model).__name__}, config.json names {wanted}")
    bad = {
        k: v
        for k, v in info.items()
        if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    if bad:
        sys.exit(f"{directory}: from_pretrained: {bad}")
    return model.eval()


def gemma3_kwargs(a, kwargs):
    """Gemma 3's keys: rope per layer type, layer_types alternating from a sliding first."""
    full = {"rope_type": "default", "rope_theta": a.theta}
    if a.rope_scaling:
        full = {"rope_type": "linear", "factor": 8.0, "rope_theta": a.theta}
    del kwargs["rope_theta"], kwargs["rope_scaling"]
    kwargs["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    kwargs["query_pre_attn_scalar"] = 20
    kwargs["attention_bias"] = a.bias
    kwargs["sliding_window"] = a.window or 4096
    kwargs["layer_types"] = [
        "sliding_attention" if a.window and i % 2 == 0 else "full_attention"
        for i in range(a.layers)
    ]


def make(a):
    torch.manual_seed(a.seed)
    scaling = None
    if a.rope_scaling:
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        }
    # A wider initialisation than 0.02 gives peaked logits, so greedy choices are not decided by
    # rounding.
    kwargs = dict(
        vocab_size=a.vocab,
        hidden_size=a.width,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        max_position_embeddings=a.positions,
        rope_theta=a.theta,
        rope_scaling=scaling,
        tie_word_embeddings=not a.untied,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if a.model_type in ("llama", "qwen3"):
        kwargs["attention_bias"] = a.bias
    if a.model_type == "llama":
        kwargs["mlp_bias"] = a.bias
    if a.model_type == "mistral":
        kwargs["sliding_window"] = a.window
    elif a.model_type in ("qwen2", "qwen3") and a.window:
        kwargs["use_sliding_window"] = True
        kwargs["sliding_window"] = a.window
        kwargs["layer_types"] = [
            "sliding_attention" if i % 2 else "full_attention" for i in range(a.layers)
        ]
    if a.model_type == "gemma3":
        gemma3_kwargs(a, kwargs)
    if a.head_dim is None:
        del kwargs["head_dim"]
    config = CONFIGS[a.model_type](**kwargs)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms and biases away from 1 and 0, as after training
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):  # Gemma's from 0
                p.add_(torch.randn_like(p) * 0.1)
    if a.tokenizer:
        save_tokenizer(model, a.tokenizer, a.dir)
    if a.dtype != "fp32":  # the files in 16 bits; the expected logits from the rounded weights
        model = model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype])
    model.save_pretrained(a.dir, safe_serialization=True, max_shard_size=a.max_shard_size)
    model = model.float()
    steps = a.positions // 2
    g = torch.Generator().manual_seed(a.seed + 1)
    inputs = torch.randint(0, a.vocab, (2, steps), generator=g)
    prompt = torch.randint(0, a.vocab, (1, 5), generator=g)
    with torch.no_grad():
        logits = model(inputs).logits
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=steps,
            min_new_tokens=steps,
            pad_token_id=0,
        )
    save_file(loss_and_grads(model, inputs), os.path.join(a.dir, "grads.safetensors"))
    save_file(
        {
            "inputs": inputs,
            "logits": logits.contiguous(),
            "prompt": prompt,
            "greedy": out[0, prompt.shape[1] :].contiguous(),
        },
        os.path.join(a.dir, "expected.safetensors"),
    )


def save_tokenizer(model, path, directory):
    """Saves the tokenizer.json `path` into `directory` through transformers, and zeroes the output
    embeddings of its byte tokens."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=path)
    tok.save_pretrained(directory)
    rows = [i for t, i in tok.get_vocab().items() if re.fullmatch("<0x[0-9A-F]{2}>", t)]
    with torch.no_grad():
        model.get_output_embeddings().weight[rows] = 0


def logits(a):
    model = load(a.dir)
    inputs = load_file(a.inp)["inputs"].long()
    with torch.no_grad():
        save_file({"logits": model(inputs).logits.contiguous()}, a.out)


def greedy(a):
    model = load(a.dir)
    tok = None
    if os.path.exists(os.path.join(a.dir, "tokenizer.json")):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.dir)
        prompt = torch.tensor([tok(a.prompt, add_special_tokens=False)["input_ids"]])
    else:
        prompt = torch.tensor([list(a.prompt.encode())])
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=a.n,
            min_new_tokens=a.n,
            pad_token_id=0,
        )
    if tok is not None:
        text = tok.decode(out[0].tolist(), skip_special_tokens=False)
        sys.stdout.buffer.write(text.encode() + b"\n")
        return
    sys.stdout.buffer.write(a.prompt.encode() + bytes(out[0, prompt.shape[1] :].tolist()) + b"\n")


def checkpoint_logits(a):
    config = LlamaConfig.from_pretrained(a.config_dir)
    model = LlamaForCausalLM(config).eval()
    ckpt = load_file(a.ckpt)
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    state = {}
    for key, t in ckpt.items():
        if not key.startswith("param."):
            continue
        name = key[len("param.") :]
        if name in ("embed_tokens.weight", "lm_head.weight"):
            t = t[: config.vocab_size]
        if ".qkv_proj." in name:
            parts = torch.split(t, [heads * hd, kv * hd, kv * hd], dim=0)
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                state["model." + name.replace("qkv_proj", proj)] = part
            continue
        state[name if name == "lm_head.weight" else "model." + name] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"{a.ckpt}: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    inputs = load_file(a.inp)["inputs"].long()
    with torch.no_grad():
        save_file({"logits": model(inputs).logits.contiguous()}, a.out)


def loss_and_grads(model, inputs):
    model.zero_grad()
    loss = model(inputs, labels=inputs).loss
    loss.backward()
    out = {"loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out[name] = p.grad.contiguous()
    return out


def grads(a):
    save_file(loss_and_grads(load(a.dir), load_file(a.inp)["inputs"].long()), a.out)


def close(a):
    x, y = load_file(a.a)["logits"].double(), load_file(a.b)["logits"].double()
    gap = float((x - y).abs().max()) if x.shape == y.shape else float("inf")
    print(f"largest logit gap {gap:.3e} (allowed {a.tol:g})")
    sys.exit(0 if gap <= a.tol else 1)


def loss(a):
    value, windows = shard_loss(load(a.dir), a.shard, a.context)
    print(f"{value:.6f} over {windows} windows")


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for key in ("vocab", "layers", "heads", "kv-heads", "width", "intermediate", "positions"):
        m.add_argument("--" + key, type=int, required=True)
    m.add_argument("--head-dim", type=int, default=None)
    m.add_argument("--model-type", choices=tuple(CONFIGS), default="llama")
    m.add_argument("--window", type=int, default=None)
    m.add_argument("--theta", type=float, default=10000.0)
    m.add_argument("--untied", action="store_true")
    m.add_argument("--rope-scaling", action="store_true")
    m.add_argument("--bias", action="store_true")
    m.add_argument("--max-shard-size", default="5GB")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    m.add_argument("--tokenizer", default=None)
    lg = sub.add_parser("logits")
    lg.add_argument("dir")
    lg.add_argument("inp")
    lg.add_argument("out")
    gr = sub.add_parser("greedy")
    gr.add_argument("dir")
    gr.add_argument("prompt")
    gr.add_argument("n", type=int)
    gd = sub.add_parser("grads")
    for name in ("dir", "inp", "out"):
        gd.add_argument(name)
    cl = sub.add_parser("checkpoint-logits")
    for name in ("ckpt", "config_dir", "inp", "out"):
        cl.add_argument(name)
    cc = sub.add_parser("close")
    cc.add_argument("a")
    cc.add_argument("b")
    cc.add_argument("tol", type=float)
    ls = sub.add_parser("loss")
    ls.add_argument("dir")
    ls.add_argument("shard")
    ls.add_argument("context", type=int)
    a = p.parse_args()
    {
        "make": make,
        "logits": logits,
        "greedy": greedy,
        "loss": loss,
        "checkpoint-logits": checkpoint_logits,
        "grads": grads,
        "close": close,
    }[a.command](a)


if __name__ == "__main__":
    main()
