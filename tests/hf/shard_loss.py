"""The mean next-token loss of a Hugging Face causal LM over a token shard, cut into samples as the
trainer's token dataset cuts them: every window of CONTEXT + 1 tokens starting at a multiple of
CONTEXT. Shared by hf_gpt2.py and hf_llama.py (`loss`)."""

import numpy as np
import torch

LLMC_MAGIC = 20240520  # llm.c's uint16 shard header (256 int32), written by tokenize_text.py


def read_uint16_shard(path):
    """The ids of a uint16 shard, with or without llm.c's 256-int32 header, as int64."""
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) >= 1024 and np.frombuffer(raw[:4].tobytes(), dtype="<i4")[0] == LLMC_MAGIC:
        raw = raw[1024:]
    return torch.from_numpy(np.frombuffer(raw.tobytes(), dtype="<u2").astype(np.int64))


def shard_loss(model, path, context):
    """(mean loss, number of windows) of `model` over the shard at `path`."""
    tokens = read_uint16_shard(path)
    c = context
    windows = torch.stack([tokens[k * c : k * c + c + 1] for k in range((len(tokens) - 1) // c)])
    with torch.no_grad():
        out = model(windows[:, :-1]).logits
        value = torch.nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), windows[:, 1:].reshape(-1)
        )
    return value.item(), len(windows)
