"""The masked mean loss that Hugging Face `transformers` computes on packed chat windows: the
reference of the e2e case llama_sft_chat_np2 (tests/e2e/language_models.sh). Written from
docs/reference.md, "Chat data", not from the trainer's code: the shards' documents (NAME.docs)
split into pieces of at most CONTEXT tokens (each beginning with the last token of the one before)
and packed best-fit decreasing (longest first, ties in document order, each into the open window
with the least room that still holds it, ties to the earliest window, else a new window; document
order within a window); position i of a piece reads its token i and predicts token i + 1 where that
token's mask is 1, the piece's last position predicts nothing (-100), and the rest of a window is
padding (input 0, no target, positions counting on from 0).

transformers runs every window with each token's position in its document as `position_ids` and
a 4-D block-diagonal causal attention mask (query i sees key j iff j <= i and j >= i -
positions[i]); the loss is cross_entropy with ignore_index -100 over every window: the sum of the
counted targets' losses over their number. As a check of the windows themselves, each document
is also run alone (plain causal attention), and the two losses must agree to 1e-5.

usage: sft_loss.py MODEL_DIR SHARDS_DIR CONTEXT
    prints "LOSS over N windows" (the training split: train_*.bin, in name order)
"""

import bisect
import glob
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_loss import read_uint16_shard  # noqa: E402

HEADER = 32  # the .mask and .docs files' header: magic, version, 0, count, 0


def documents(shard):
    """(tokens, mask) of each document of `shard`, in order."""
    tokens = read_uint16_shard(shard)
    mask = np.fromfile(shard[: -len(".bin")] + ".mask", dtype=np.uint8)[HEADER:]
    offsets = np.fromfile(shard[: -len(".bin")] + ".docs", dtype="<u8")[HEADER // 8 :]
    assert len(mask) == len(tokens) and offsets[-1] == len(tokens), shard
    return [(tokens[a:b], torch.from_numpy(mask[a:b].astype(np.int64)))
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def pieces(docs, context):
    """Each document cut into pieces of at most `context` tokens overlapping by one."""
    out = []
    for tokens, mask in docs:
        begin = 0
        while True:
            end = min(begin + context, len(tokens))
            out.append((tokens[begin:end], mask[begin:end]))
            if end == len(tokens):
                break
            begin = end - 1
    return out


def pack(parts, context):
    """Best-fit decreasing: the windows, each a list of indices into `parts` in their order."""
    order = sorted(range(len(parts)), key=lambda p: -len(parts[p][0]))  # stable: ties in order
    room = []  # sorted (room left, window) of the open windows
    windows = []
    for p in order:
        length = len(parts[p][0])
        i = bisect.bisect_left(room, (length, -1))
        if i == len(room):
            w, left = len(windows), context
            windows.append([])
        else:
            left, w = room.pop(i)
        windows[w].append(p)
        if left - length > 0:
            bisect.insort(room, (left - length, w))
    return [sorted(w) for w in windows]


def window_tensors(parts, windows, context):
    n = len(windows)
    inputs = torch.zeros(n, context, dtype=torch.long)
    targets = torch.full((n, context), -100, dtype=torch.long)
    positions = torch.zeros(n, context, dtype=torch.long)
    for w, members in enumerate(windows):
        at = 0
        for p in members:
            tokens, mask = parts[p]
            length = len(tokens)
            inputs[w, at : at + length] = tokens
            positions[w, at : at + length] = torch.arange(length)
            nxt = torch.where(mask[1:] == 1, tokens[1:], torch.tensor(-100))
            targets[w, at : at + length - 1] = nxt
            at += length
        positions[w, at:] = torch.arange(context - at)  # padding: one more "document"
    return inputs, targets, positions


def block_diagonal(positions):
    """[n, 1, T, T] bool: query i sees key j iff j <= i and j >= i - positions[i]."""
    steps = positions.shape[1]
    i = torch.arange(steps)[:, None]
    j = torch.arange(steps)[None, :]
    first = i[None] - positions[:, :, None]
    return ((j <= i)[None] & (j[None] >= first))[:, None]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model_dir, shards, context = sys.argv[1], sys.argv[2], int(sys.argv[3])
    docs = [d for s in sorted(glob.glob(os.path.join(shards, "train_*.bin"))) for d in documents(s)]
    parts = pieces(docs, context)
    windows = pack(parts, context)
    inputs, targets, positions = window_tensors(parts, windows, context)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = model.config.vocab_size
    with torch.no_grad():
        mask = block_diagonal(positions)
        logits = model(input_ids=inputs, position_ids=positions, attention_mask=mask).logits
        packed = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1),
                                 ignore_index=-100, reduction="sum")
        count = (targets != -100).sum().item()
        # Each piece alone, plain causal attention: the same sum.
        alone = 0.0
        for tokens, piece_mask in parts:
            out = model(input_ids=tokens[None]).logits[0, :-1]
            nxt = torch.where(piece_mask[1:] == 1, tokens[1:], torch.tensor(-100))
            alone += F.cross_entropy(out.float(), nxt, ignore_index=-100, reduction="sum").item()
    loss = packed.item() / count
    if abs(alone / count - loss) > 1e-5 * loss:
        sys.exit(f"the packed windows' loss {loss} differs from the documents' alone "
                 f"{alone / count}")
    print(f"{loss:.8f} over {len(windows)} windows")


if __name__ == "__main__":
    main()
