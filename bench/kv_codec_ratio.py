"""Bytes a lossless codec saves on real KV: the KV store's chunks of a model on a text.

Runs the model (HF transformers on the GGUF, float32 or bfloat16) over a WikiText-2 excerpt,
captures every layer's keys before RoPE (k_proj outputs) and values, lays them out as the store's
chunks (16 tokens x [layers][K, V][kv_heads][16][head_dim] in the pool dtype), and compresses each
chunk with the zstd CLI at the store's level (1). Prints one JSON object.

  .venv/bin/python bench/kv_codec_ratio.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import subprocess
from pathlib import Path

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--text", default="../shared/data/ppl/wikitext-2-raw-v1_test.raw")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(args.model)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 torch_dtype=torch.float32)
    dtype = getattr(torch, args.dtype)
    ids = tok(Path(args.text).read_text()[10000:10000 + args.tokens * 8],
              return_tensors="pt").input_ids[:, : args.tokens]
    cfg = model.config
    kv_heads = cfg.num_key_value_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    captured = {}

    def hook(name):
        def fn(_module, _inputs, out):
            captured[name] = out[0].reshape(-1, kv_heads, head_dim).to(dtype)
        return fn

    for i, layer in enumerate(model.model.layers):
        layer.self_attn.k_proj.register_forward_hook(hook(("k", i)))
        layer.self_attn.v_proj.register_forward_hook(hook(("v", i)))
    with torch.no_grad():
        model(ids)
    block = 16
    chunks = ids.shape[1] // block
    raw = encoded = 0
    for c in range(chunks):
        parts = []
        for i in range(cfg.num_hidden_layers):
            for kind in ("k", "v"):
                x = captured[(kind, i)][c * block:(c + 1) * block]  # [16, Hkv, D]
                parts.append(x.permute(1, 0, 2).contiguous())       # [Hkv, 16, D]
        data = torch.stack(parts).contiguous().view(torch.uint8).numpy().tobytes()
        out = subprocess.run(["zstd", "-1", "-q", "-c"], input=data, capture_output=True, check=True)
        raw += len(data)
        encoded += len(out.stdout)
    print(json.dumps({"model": path.name, "dtype": args.dtype, "chunks": chunks,
                      "chunk_bytes": raw // chunks, "zstd_level": 1,
                      "stored_bytes_per_raw_byte": encoded / raw}, indent=2))


if __name__ == "__main__":
    main()
