"""The preference objectives as their papers write them, over transformers (+ PEFT)
log-probabilities: the reference of tests/unit/preference_objective_test.cpp. Written from
docs/reference.md ("Preference data") and the papers, not from the trainer's code:

- a pair's shards (scripts/tokenize_text.py --preference): NAME.bin uint16 tokens, NAME.mask one
  byte per token (1 on the completion), NAME.docs the sequences' boundaries, documents 2p and
  2p + 1 pair p's chosen and rejected sequences;
- log pi(y | x) of a sequence: the sum over its tokens i >= 1 whose mask is 1 of
  log_softmax(logits[i - 1])[token i] (transformers' logits of the whole sequence, alone);
- DPO (Rafailov et al. 2023): h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)),
  loss -log sigmoid(beta h); cDPO (Mitchell 2023, as TRL's label_smoothing): -(1 - e) log
  sigmoid(beta h) - e log sigmoid(-beta h); the reference under LoRA the base with the adapter
  disabled (PEFT's disable_adapter()), in full fine-tuning the model's initial weights;
- SimPO (Meng et al. 2024): -log sigmoid(beta / |y_w| log pi(y_w) - beta / |y_l| log pi(y_l) -
  gamma), |y| the completion's tokens;
- the batch's loss is the mean over its pairs.

usage: preference_loss.py BASE SHARD OUT --pairs N --objective dpo|simpo --beta B
           [--label-smoothing E] [--gamma G] [--adapter DIR]
    OUT (safetensors): `loss`, `logps` float64 [N, 2] (the policy's, summed), and the gradient
    of every trainable parameter: PEFT's adapter keys as save_pretrained writes them (with
    --adapter), else transformers' names.
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

HEADER = 32  # the .mask and .docs files' header


def sequences(shard, pairs):
    """The first `pairs` pairs of `shard`: [(chosen, rejected)], each (tokens, mask) int64."""
    stem = shard[: -len(".bin")]
    tokens = np.fromfile(shard, dtype="<u2").astype(np.int64)
    mask = np.fromfile(stem + ".mask", dtype=np.uint8)[HEADER:].astype(np.int64)
    offsets = np.fromfile(stem + ".docs", dtype="<u8")[HEADER // 8 :].astype(np.int64)
    assert os.path.exists(stem + ".pairs"), stem
    docs = [(torch.from_numpy(tokens[a:b]), torch.from_numpy(mask[a:b]))
            for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return [(docs[2 * p], docs[2 * p + 1]) for p in range(pairs)]


def logp(model, tokens, mask):
    """log pi of the sequence's completion, and its number of tokens."""
    logits = model(input_ids=tokens[None]).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, tokens[1:, None])[:, 0]
    counted = mask[1:] == 1
    return picked[counted].sum(), int(counted.sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("shard")
    p.add_argument("out")
    p.add_argument("--pairs", type=int, required=True)
    p.add_argument("--objective", choices=["dpo", "simpo"], required=True)
    p.add_argument("--beta", type=float, required=True)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--gamma", type=float, default=0.0)
    p.add_argument("--adapter")
    a = p.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.base, torch_dtype=torch.float32)
    if a.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, a.adapter, is_trainable=True)
    model.eval()  # no dropout, as the trainer's tiny models
    data = sequences(a.shard, a.pairs)
    # The reference first, without gradient: the base alone (LoRA) or the initial weights.
    refs = []
    if a.objective == "dpo":
        with torch.no_grad():
            for pair in data:
                if a.adapter:
                    with model.disable_adapter():
                        refs.append([logp(model, *seq)[0] for seq in pair])
                else:
                    refs.append([logp(model, *seq)[0] for seq in pair])
    losses, logps = [], []
    for k, pair in enumerate(data):
        (cw, nw), (cl, nl) = (logp(model, *seq) for seq in pair)
        logps.append([cw.detach(), cl.detach()])
        if a.objective == "dpo":
            h = (cw - refs[k][0]) - (cl - refs[k][1])
            e = a.label_smoothing
            losses.append(-(1 - e) * F.logsigmoid(a.beta * h) - e * F.logsigmoid(-a.beta * h))
        else:
            margin = a.beta * cw / nw - a.beta * cl / nl - a.gamma
            losses.append(-F.logsigmoid(margin))
    loss = torch.stack(losses).mean()
    loss.backward()
    out = {"loss": loss.detach().double().reshape(1),
           "logps": torch.tensor([[float(x) for x in row] for row in logps], dtype=torch.float64)}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        # PEFT's saved key: without the adapter's name.
        out[name.replace(".default", "")] = param.grad.detach().contiguous()
    save_file(out, a.out)


if __name__ == "__main__":
    main()
