#!/usr/bin/env python3
"""Reference outputs from HF transformers for the executor parity tests.

Writes into <out-dir>/model/:
  smollm2/index.json       20 prompts run through HF transformers on the default GGUF (fp32, CPU):
                           prompt ids, 32 greedy tokens, top-2 logit gap at each step
  smollm2/<case>.f32       last-prompt-position logits [vocab] (float32) per case
  smollm2/prompt_logprobs.json
                           a ~700-token WikiText passage: its ids and the logprob HF gives each
                           token after the first (log-softmax of the logits before it)
  tiny_qwen2.gguf          a random-weight qwen2 model written here with gguf-py (F32/F16/Q8_0
                           tensors), with tiny_qwen2/index.json + .f32 like above
  tiny_qwen2_1layer.gguf   the same with one layer (for exact checks of truncated KV reuse)
  tiny_llama3_hf/          a random-weight llama HF directory (safetensors, Llama-3 RoPE scaling,
                           untied head) with tiny_llama3_hf_ref/index.json + .f32

Everything is deterministic (fixed seeds, greedy decoding, fp32).
"""
import argparse
import json
import lzma
import os
from pathlib import Path

import numpy as np
import torch

NUM_NEW_TOKENS = 32


def greedy_reference(model, prompts, out_dir: Path):
    """Runs each prompt through `model` and writes index.json + one logits file per case."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = []
    for i, ids in enumerate(prompts):
        # Plain greedy loop over raw logits with HF's KV cache: no logits processors, so an EOS
        # token is just another token and the 32 steps always run.
        generated, step_logits = [], []
        past = None
        next_input = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            for _ in range(NUM_NEW_TOKENS):
                out = model(input_ids=next_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                step_logits.append(logits)
                token = int(logits.argmax())
                generated.append(token)
                next_input = torch.tensor([[token]], dtype=torch.long)
        step_logits = torch.stack(step_logits)
        top2 = step_logits.topk(2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1]).tolist()
        name = f"case{i:02d}"
        step_logits[0].numpy().astype(np.float32).tofile(out_dir / f"{name}.f32")
        cases.append({"name": name, "prompt_ids": ids, "generated_ids": generated,
                      "top2_gaps": gaps})
    (out_dir / "index.json").write_text(json.dumps({"cases": cases}))


def prompt_logprob_reference(model, tokenizer, data_dir: Path, out_dir: Path):
    """Scores a real passage in one full forward: the reference for the engine's prompt_logprobs."""
    wiki = (data_dir / "ppl" / "wikitext-2-raw-v1_test.raw").read_text(encoding="utf-8")
    ids = tokenizer.encode(wiki[20000:23000])[:700]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
    (out_dir / "prompt_logprobs.json").write_text(
        json.dumps({"prompt_ids": ids, "logprobs": logprobs[:, 0].tolist()}))


def smollm2_prompts(tokenizer, data_dir: Path):
    """20 prompts: plain and chat-formatted, short and ~1K tokens, from real text."""
    wiki = (data_dir / "ppl" / "wikitext-2-raw-v1_test.raw").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in wiki.split("\n") if len(p.strip()) > 400]
    convs = json.load(lzma.open(data_dir / "sharegpt" / "sharegpt_v3_sample1000.json.xz", "rt",
                                encoding="utf-8"))
    questions = [c["conversations"][0]["value"] for c in convs
                 if c["conversations"] and c["conversations"][0]["from"] == "human"
                 and 20 < len(c["conversations"][0]["value"]) < 300]
    short_plain = [
        "The capital of France is",
        "def fibonacci(n):\n    ",
        "Once upon a time, in a small village by the sea,",
        "1, 2, 3, 4, 5,",
        "Water boils at",
    ]
    prompts = [tokenizer.encode(p) for p in short_plain]
    for q in questions[:5]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(text))
    # ~1K-token plain prompts: consecutive wikitext paragraphs.
    for start in (0, 40, 80, 120, 160):
        ids = tokenizer.encode(" ".join(paragraphs[start:start + 12]))
        prompts.append(ids[:1000])
    # ~1K-token chat prompts: a long document plus a question.
    for start in (200, 240, 280, 320, 360):
        doc = tokenizer.decode(tokenizer.encode(" ".join(paragraphs[start:start + 12]))[:900])
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": doc + "\n\nSummarise the text above in one sentence."}],
            tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text))
    return prompts


def write_tiny_qwen2_gguf(path: Path, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                          head_dim: int = 16, ffn: int = 128, vocab: int = 320):
    """A random-weight qwen2 GGUF (F32 norms, F16 / Q8_0 matrices, QKV biases, untied head)."""
    import gguf

    rng = np.random.default_rng(1234)
    hidden = heads * head_dim
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    # A minimal byte-level vocabulary with one merge, so the engine can build a tokenizer for it.
    tokens = ([bytes([b]).decode("latin-1") for b in range(256)] + ["ab"] +
              [f"tok{i}" for i in range(vocab - 257)])
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a b"])

    def mat(rows, cols, scale=0.08):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def add(name, data, qtype):
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, data.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    F32, F16, Q8 = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                    gguf.GGMLQuantizationType.Q8_0)
    add("token_embd.weight", mat(vocab, hidden, 0.5), Q8)
    for l in range(layers):
        p = f"blk.{l}."
        add(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32), F32)
        add(p + "attn_q.weight", mat(heads * head_dim, hidden), Q8)
        add(p + "attn_k.weight", mat(kv_heads * head_dim, hidden), F16)
        add(p + "attn_v.weight", mat(kv_heads * head_dim, hidden), Q8)
        add(p + "attn_q.bias", 0.1 * rng.standard_normal(heads * head_dim).astype(np.float32), F32)
        add(p + "attn_k.bias", 0.1 * rng.standard_normal(kv_heads * head_dim).astype(np.float32), F32)
        add(p + "attn_v.bias", 0.1 * rng.standard_normal(kv_heads * head_dim).astype(np.float32), F32)
        add(p + "attn_output.weight", mat(hidden, heads * head_dim), F16)
        add(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32), F32)
        add(p + "ffn_gate.weight", mat(ffn, hidden), Q8)
        add(p + "ffn_up.weight", mat(ffn, hidden), F16)
        add(p + "ffn_down.weight", mat(hidden, ffn), Q8)
    add("output_norm.weight", 1 + 0.1 * rng.standard_normal(hidden).astype(np.float32), F32)
    add("output.weight", mat(vocab, hidden, 0.5), F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return vocab


def write_tiny_llama3_hf(path: Path):
    """A random-weight llama HF directory with Llama-3 RoPE scaling and an untied LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4321)
    config = LlamaConfig(
        vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
        # Norm weights near 1 so activations stay in a realistic range.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[3] / "shared" / "data")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out = args.out_dir / "model"
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Default model, from its GGUF: HF dequantizes it with gguf-py and runs its own llama code.
    model_dir, model_file = str(args.model.parent), args.model.name
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file,
                                                 dtype=torch.float32).eval()
    greedy_reference(model, smollm2_prompts(tokenizer, args.data_dir), out / "smollm2")
    prompt_logprob_reference(model, tokenizer, args.data_dir, out / "smollm2")

    # qwen2 path: NeoX RoPE on unpermuted GGUF rows, QKV biases.
    qwen_path = out / "tiny_qwen2.gguf"
    vocab = write_tiny_qwen2_gguf(qwen_path)
    qwen = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=qwen_path.name,
                                                dtype=torch.float32).eval()
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, vocab, size=n).tolist() for n in (1, 7, 64, 200)]
    greedy_reference(qwen, prompts, out / "tiny_qwen2")
    # One layer: its keys and values depend only on each token and its position, so KV loaded
    # and re-rotated after a truncation equals recomputing the truncated prompt (engine tests).
    write_tiny_qwen2_gguf(out / "tiny_qwen2_1layer.gguf", layers=1)

    # HF directory path with Llama-3 RoPE scaling (prompts longer than the original context).
    llama = write_tiny_llama3_hf(out / "tiny_llama3_hf")
    prompts = [rng.integers(0, 300, size=n).tolist() for n in (3, 50, 300)]
    greedy_reference(llama, prompts, out / "tiny_llama3_hf_ref")


if __name__ == "__main__":
    main()
