"""ChatML (Qwen's chat format) for the SFT test of Llama's kin (tests/e2e/language_models.sh,
qwen3_sft_chatml_np2). Offline.

usage:
  chatml.py tokenizer SRC_DIR OUT_DIR
      SRC_DIR's tokenizer.json with <|im_start|> and <|im_end|> added as special tokens, written to
      OUT_DIR with a tokenizer_config.json holding Qwen2.5's ChatML template (eos <|im_end|>);
      prints the vocabulary's size.
  chatml.py check-masks TOKENIZER_DIR SHARDS_DIR INPUT.jsonl
      Each conversation of the shards (NAME.docs) against INPUT's: the tokens whose mask is 1,
      decoded run by run, must be exactly each assistant turn's content followed by <|im_end|>
      (the newline after it, which the model never writes, is not one), and nothing else.
      Prints "N conversations, M assistant turns: the masks cover the assistant turns only".
"""

import glob
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
from tokenizers import AddedToken, Tokenizer  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_loss import read_uint16_shard  # noqa: E402

HEADER = 32  # the .mask and .docs files' header
# Qwen2.5's template without its tools branch: a system turn first when there is none.
TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tokenizer(src, out):
    tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True),
                            AddedToken("<|im_end|>", special=True)])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|im_end|>", "chat_template": TEMPLATE}, f, indent=2)
    print(tok.get_vocab_size())


def check_masks(tok_dir, shards, jsonl):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"))
    conversations = [json.loads(line)["messages"] for line in open(jsonl) if line.strip()]
    docs = []
    for shard in sorted(glob.glob(os.path.join(shards, "*_*.bin"))):
        tokens = read_uint16_shard(shard)
        mask = np.fromfile(shard[: -len(".bin")] + ".mask", dtype=np.uint8)[HEADER:]
        offsets = np.fromfile(shard[: -len(".bin")] + ".docs", dtype="<u8")[HEADER // 8:]
        docs += [(tokens[a:b], mask[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    if len(docs) != len(conversations):
        sys.exit(f"{len(docs)} conversations in the shards, {len(conversations)} in {jsonl}")
    turns = 0
    for i, ((tokens, mask), messages) in enumerate(zip(docs, conversations, strict=True)):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        runs = [tok.decode(tokens[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2],
                                                                   strict=True)]
        wanted = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        if runs != wanted:
            sys.exit(f"conversation {i}: the masked runs {runs!r} are not the assistant turns "
                     f"{wanted!r}")
        turns += len(wanted)
    print(f"{len(docs)} conversations, {turns} assistant turns: the masks cover the assistant "
          "turns only")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "check-masks":
        check_masks(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
