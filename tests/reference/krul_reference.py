#!/usr/bin/env python3
"""Reference attention statistics for Krul (docs/krul.md) from HF transformers' eager attention.

Writes <out-dir>/model/krul/reference.json: a real chat prompt (a ShareGPT exchange in SmolLM2's
chat template) followed by HF's 24 greedy tokens, run through the default GGUF in fp32 with
output_attentions, and from the whole attention matrices (float64, offline):
  edge_share[l]        mean over query heads and rows of the probability on each row's first and
                       last max(1, floor(len / 10)) positions (len = row position + 1)
  squared[i][j][h]     for i > j: sum over rows of ||A_i[h, r, :] - A_j[h, r, :]||^2
and the same two over the rows at multiples of 4 only ("strided": kv_store.krul_row_stride).
The executor's split accumulation (prompt rows reduced after the passes, decode rows each step)
must equal these (tests/model/krul_executor_test.cpp).
"""
import argparse
import json
import lzma
from pathlib import Path

import numpy as np
import torch

NEW_TOKENS = 24
STRIDE = 4


def chat_prompt(tokenizer, data_dir: Path):
    convs = json.load(lzma.open(data_dir / "sharegpt" / "sharegpt_v3_sample1000.json.xz", "rt",
                                encoding="utf-8"))
    for c in convs:
        turns = c["conversations"]
        if len(turns) >= 2 and turns[0]["from"] == "human" and 300 < len(turns[0]["value"]) < 900:
            messages = [{"role": "user", "content": turns[0]["value"]}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
            return tokenizer.encode(text, add_special_tokens=False)
    raise RuntimeError("no suitable conversation")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[3] / "shared" / "data")
    args = parser.parse_args()
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, model_file = str(args.model.parent), args.model.name
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file,
                                                 dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    prompt = list(chat_prompt(tokenizer, args.data_dir))
    with torch.no_grad():
        ids = list(prompt)
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
        attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    a = np.stack([t[0].double().numpy() for t in attentions])  # [layers, heads, s, s]
    layers, heads, s, _ = a.shape
    lengths = np.arange(1, s + 1)
    edge = np.maximum(1, lengths // 10)
    pos = np.arange(s)
    mask = (pos[None, :] < edge[:, None]) | ((pos[None, :] >= (lengths - edge)[:, None])
                                            & (pos[None, :] < lengths[:, None]))

    def statistics(rows):
        edge_share = [float((a[l][:, rows] * mask[rows][None]).sum() / (heads * len(rows)))
                      for l in range(layers)]
        squared = [[[0.0] * heads for _ in range(layers)] for _ in range(layers)]
        for i in range(layers):
            for j in range(i):
                d = ((a[i][:, rows] - a[j][:, rows]) ** 2).sum(axis=(1, 2))
                squared[i][j] = d.tolist()
        return edge_share, squared

    edge_share, squared = statistics(np.arange(s))
    strided_edge_share, strided_squared = statistics(np.arange(0, s, STRIDE))
    out = args.out_dir / "model" / "krul"
    out.mkdir(parents=True, exist_ok=True)
    (out / "reference.json").write_text(json.dumps({
        "prompt_ids": prompt, "generated_ids": ids[len(prompt):],
        "edge_share": edge_share, "squared": squared,
        "strided": {"stride": STRIDE, "edge_share": strided_edge_share,
                    "squared": strided_squared}}))


if __name__ == "__main__":
    main()
