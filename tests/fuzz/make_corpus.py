"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/TARGET/) from the formats' own
writers where there is one (safetensors, transformers' configs, PEFT's LoraConfig, Pillow's PNG)
and from the repository's fixtures (configs/, data/, tests/unit/bpe_reference.py's tokenizers).

    tests/fuzz/make_corpus.py [BPE_REFERENCE_DIR]

BPE_REFERENCE_DIR: the output of tests/unit/bpe_reference.py DIR (its tokenizer.json files);
without it the tokenizer.json corpus is left as it is. Run with the virtualenv's Python
(scripts/env.sh: $TRAINER_VENV). The files are committed; this script says where they came from.
"""

import base64
import io
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/fuzz/corpus"
SEP = b"\n--8<--\n"  # fuzz::kSeparator


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds():
    import torch
    from safetensors.torch import save

    put(
        "safetensors_header", "f32", save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
    )
    put(
        "safetensors_header",
        "mixed",
        save(
            {
                "a": torch.ones(2, dtype=torch.bfloat16),
                "b": torch.zeros(0, 3, dtype=torch.int64),
                "c": torch.tensor(7, dtype=torch.int8),
                "d": torch.tensor([True, False]),
                "e": torch.ones(1, 2, 1, dtype=torch.float16),
            },
            metadata={"format": "pt", "crc": "crc32:00000000"},
        ),
    )
    header = b'{"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}'
    put("safetensors_header", "hand", struct.pack("<Q", len(header)) + header + bytes(8))
    put("safetensors_header", "short", struct.pack("<Q", 100) + b"{}")

    index = {
        "metadata": {"total_size": 56},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    put("safetensors_index", "index.json", json.dumps(index, indent=2))
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    put("safetensors_index", "misplaced.json", json.dumps(index))
    put("safetensors_index", "escape.json", json.dumps({"weight_map": {"a": "../index/x"}}))


def manifest_seeds():
    def manifest(world, order=False):
        size = (10 + world - 1) // world
        files = []
        for r in range(world):
            begin, end = r * size, min(r * size + size, 10)
            pieces = (
                []
                if begin >= end
                else [
                    {
                        "name": "w",
                        "offset": begin,
                        "count": end - begin,
                        "key": "block.0",
                        "key_offset": 0,
                    }
                ]
            )
            if r == 0:
                pieces.append({"name": "b", "offset": 0, "count": 3, "key": "b", "key_offset": 0})
            files.append(
                {
                    "file": f"rank_{r:05d}.safetensors",
                    "rank": r,
                    "bytes": 0,
                    "crc32": "crc32:00000000",
                    "pieces": pieces,
                }
            )
        w = {"dtype": "F32", "shape": [2, 5]}
        if order:
            w["order"] = [1, 0]
        return {
            "format": "trainer-sharded-checkpoint-v2" if order else "trainer-sharded-checkpoint-v1",
            "world_size": world,
            "shard_mode": "optimizer",
            "step": 7,
            "global_batch_size": 8,
            "seed": 3,
            "config": "model: {name: mlp}\n",
            "tensors": {"w": w, "b": {"dtype": "F32", "shape": [3]}},
            "files": files,
        }

    put("shard_manifest", "world2.json", json.dumps(manifest(2), indent=1))
    put("shard_manifest", "world3_order.json", json.dumps(manifest(3, True), indent=1))
    lora = manifest(1)
    lora.update({"schedule": "cosine", "base": "/models/gpt2", "base_hash": "crc32:12345678"})
    put("shard_manifest", "lora.json", json.dumps(lora))


def hf_config_seeds():
    import transformers as t

    small = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    configs = [
        (
            0,
            "llama",
            t.LlamaConfig(
                **small,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        (
            1,
            "qwen2",
            t.Qwen2Config(**small, use_sliding_window=True, sliding_window=16, max_window_layers=1),
        ),
        (2, "qwen3", t.Qwen3Config(**small, head_dim=32)),
        (3, "mistral", t.MistralConfig(**small, sliding_window=32)),
        (4, "gemma3", t.Gemma3TextConfig(**small, head_dim=16)),
        (5, "gpt2", t.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=1000)),
    ]
    for byte, name, config in configs:
        put("hf_config", name, bytes([byte]) + config.to_json_string().encode())


def peft_seeds():
    from peft import LoraConfig

    for byte, name, targets in [(0x01, "llama", ["q_proj", "v_proj"]), (0x47, "gpt2", ["c_attn"])]:
        rank = 1 + (byte & 15)
        config = LoraConfig(r=rank, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM")
        d = config.to_dict()
        d["target_modules"] = sorted(d["target_modules"])
        put("peft_config", name, bytes([byte]) + json.dumps(d, indent=2, default=str).encode())
    put(
        "peft_config",
        "dora",
        b"\x01" + json.dumps({"peft_type": "LORA", "r": 2, "use_dora": True}).encode(),
    )


def tokenizer_seeds(reference):
    if reference is not None:
        for kind in [
            "gpt2-pattern",
            "llama3-pattern",
            "digits-prefix",
            "wide",
            "spm-llama2",
            "spm-first",
            "spm-gemma",
            "spm-never",
        ]:
            shutil.copy(
                Path(reference) / kind / "tokenizer.json",
                CORPUS / "tokenizer_json" / f"{kind}.json",
            )
    small = {
        "model": {
            "type": "BPE",
            "unk_token": "<unk>",
            "byte_fallback": True,
            "vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0x41>": 4},
            "merges": ["a b"],
        },
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "added_tokens": [
            {
                "id": 5,
                "content": "<s>",
                "special": True,
                "normalized": False,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
            }
        ],
    }
    put("tokenizer_json", "small-spm.json", json.dumps(small))

    ranks = Path.home() / ".cache/trainer/gpt2.tiktoken"
    if ranks.exists():
        lines = ranks.read_bytes().split(b"\n")
        put("tiktoken_ranks", "first-300", b"\n".join(lines[:300]) + b"\n")
    put("tiktoken_ranks", "bad", base64.b64encode(b"hi") + b" 5\n" + b"!!! 6\n")

    texts = [
        "Hello world, it's 2024!\n\tcode  here",
        "caf\u00e9 \u4f60\u597d \U0001f600 \u0645\u0631\u062d\u0628\u0627",
        "<|begin_of_text|>user<|end_header_id|>hi<|eot_id|>",
        "   \r\n\r\n  x",
    ]
    for i, text in enumerate(texts):
        for tok in range(4):
            put("tokenizer_encode", f"t{tok}-{i}", bytes([tok]) + text.encode())
    put("tokenizer_encode", "bad-utf8", b"\x01\xff\xfe\xe6\x97 abc")
    for tok in range(4):
        ids = [15496, 995, 11, 50256, 1000, 65534, 0xFFFF, 5, 300]
        put("tokenizer_decode", f"t{tok}", bytes([tok]) + struct.pack(f"<{len(ids)}H", *ids))


def sidecar(magic, count, payload):
    return magic + struct.pack("<IIQQ", 1, 0, count, 0) + payload


def token_shard_seeds():
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3], dtype=np.uint16)
    put("token_shards", "flat", bytes([0x03]) + tokens.tobytes())
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    put("token_shards", "llmc16", bytes([0x84]) + header.tobytes() + tokens.tobytes())
    header[:3] = [20240801, 7, len(tokens)]
    wide = np.array(tokens, dtype=np.uint32) * 7000
    put("token_shards", "llmc32", bytes([0x04]) + header.tobytes() + wide.tobytes())
    mask = bytes([0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1])
    docs = struct.pack("<4Q", 0, 5, 11, 16)
    chat = SEP.join(
        [tokens.tobytes(), sidecar(b"TRAINMSK", 16, mask), sidecar(b"TRAINDOC", 3, docs)]
    )
    put("token_shards", "chat", bytes([0x23]) + chat)  # packing documents
    put("token_shards", "chat-none", bytes([0x43]) + chat)  # packing none
    sample = (ROOT / "data/tokens-sample/val_000000.bin").read_bytes()
    put("token_shards", "sample-head", bytes([0x88]) + sample[: 1024 + 512])


def csv_seeds():
    lines = (ROOT / "data/timeseries-sample/series.csv").read_text().splitlines()
    put("csv_series", "sample", b"\x11" + "\n".join(lines[:24]).encode() + b"\n")
    put("csv_series", "features", b"\x0a" + "\n".join(lines[:12]).encode())
    put("csv_series", "gaps", b"\x00" + b"a, load ,b\n1,2,x\n\n3, 4 ,y\r\n+5,6e1,z\n7,8,w\n")


def png_seeds():
    def png(image, **kw):
        out = io.BytesIO()
        image.save(out, format="PNG", **kw)
        return out.getvalue()

    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB")
    put("png_image", "rgb", b"\x04" + png(rgb))
    put("png_image", "rgba", b"\x09" + png(rgb.convert("RGBA")))
    put(
        "png_image",
        "grey16",
        b"\x00" + png(Image.fromarray(rng.integers(0, 65535, (6, 5), dtype=np.uint16))),
    )
    put("png_image", "palette", b"\x1d" + png(rgb.convert("P")))
    put("png_image", "interlaced", b"\x01" + png(rgb, optimize=False, interlace=1))
    put(
        "png_image",
        "sample",
        b"\x02" + (ROOT / "data/images-sample/img_000.png").read_bytes()[:4096],
    )


def yaml_seeds():
    for f in ["quickstart", "gpt-tiny", "llama-sft", "cnn-denoise", "recommender", "sequence-lstm"]:
        put("yaml_config", f, (ROOT / f"configs/{f}.yaml").read_bytes())
    text = (ROOT / "configs/quickstart.yaml").read_bytes()
    put(
        "yaml_config",
        "with-set",
        text
        + SEP
        + b"train.steps=3"
        + SEP
        + b"model.name=gpt"
        + SEP
        + b"data.mixture=[{path: a, weight: 1}]",
    )
    put("yaml_config", "set-only", b"" + SEP + b"model.name=mlp" + SEP + b"data.dataset=synthetic")


def main():
    reference = sys.argv[1] if len(sys.argv) > 1 else None
    safetensors_seeds()
    manifest_seeds()
    hf_config_seeds()
    peft_seeds()
    tokenizer_seeds(reference)
    token_shard_seeds()
    csv_seeds()
    png_seeds()
    yaml_seeds()


if __name__ == "__main__":
    main()
