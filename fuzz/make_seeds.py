#!/usr/bin/env python3
"""Writes the committed seed inputs of the fuzz targets into fuzz/seeds/<target>/ (run once; the
files are committed). GGUF and safetensors seeds come from gguf-py and safetensors, the reference
writers; the rest are small valid inputs of each format. The SSD journal seed is written by a real
tier at fuzz time (scripts/fuzz.sh), and configs/*.yaml also seed the config target.

usage: .venv/bin/python fuzz/make_seeds.py
"""
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    directory = os.path.join(HERE, "seeds", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gguf_seeds():
    import gguf
    tokens = ["<|endoftext|>", "H", "e", "l", "o", "Ġ", "w", "r", "d", "He", "ll", "llo", "Ġw"]
    for name, with_tokenizer in (("bpe.gguf", True), ("tensors.gguf", False)):
        path = os.path.join(HERE, "seeds", "gguf", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(1)
        w.add_context_length(64)
        if with_tokenizer:
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre("smollm")
            w.add_token_list(tokens)
            w.add_token_types([3] + [1] * (len(tokens) - 1))
            w.add_token_merges(["H e", "l l", "ll o", "Ġ w"])
            w.add_bos_token_id(0)
            w.add_eos_token_id(0)
        w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
        w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def safetensors_seeds():
    from safetensors.numpy import save
    write("safetensors", "three_dtypes.safetensors", save({
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.ones((4,), dtype=np.float16),
        "c": np.zeros((2, 2), dtype=np.float32),
    }, metadata={"format": "pt"}))


def tokenizer_json_seeds():
    vocab = {"<s>": 0, "H": 1, "e": 2, "l": 3, "o": 4, "Ġ": 5, "He": 6, "ll": 7, "llo": 8}
    bpe = {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": ["H e", "l l", "ll o"]},
    }
    write("tokenizer_json", "bpe.json", json.dumps(bpe))
    unigram = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": True, "vocab": [
            ["<unk>", 0.0], ["\u2581", -1.0], ["H", -2.0], ["ello", -2.5], ["<0x41>", -9.0]]},
    }
    write("tokenizer_json", "unigram.json", json.dumps(unigram))


def openai_request_seeds():
    write("openai_request", "chat.json", json.dumps({
        "model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n"], "n": 2, "seed": 1,
        "logprobs": True, "top_logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True}, "user": "u"}))
    write("openai_request", "tools.json", json.dumps({
        "messages": [{"role": "user", "content": "weather?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "w", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {
            "name": "w", "parameters": {"type": "object", "properties": {}}}}],
        "tool_choice": "auto"}))
    write("openai_request", "schema.json", json.dumps({
        "messages": [{"role": "user", "content": "json"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}))
    write("openai_request", "completion.json", json.dumps({
        "prompt": "Once upon", "max_tokens": 8, "echo": True, "logprobs": 1,
        "frequency_penalty": 0.5, "presence_penalty": -0.5, "logit_bias": {"7": -100}}))
    write("openai_request", "token_ids.json", json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}))


def field(number, payload):
    """A length-delimited protobuf field."""
    tag, length = number << 3 | 2, len(payload)
    varint = b""
    while True:
        byte, length = length & 0x7F, length >> 7
        varint += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return bytes([tag]) + varint + payload


def grpc_request_seeds():
    sampling = field(10, b"\n") + bytes([0x0d]) + struct.pack("<f", 0.5)  # stop, temperature
    write("grpc_request", "generate", field(1, b"Once upon a time") + field(3, sampling) +
          field(6, b"user"))
    turn = lambda role, text: field(1, role) + field(2, text)  # noqa: E731
    write("grpc_request", "chat", field(1, turn(b"system", b"brief")) +
          field(1, turn(b"user", "h\u00e9llo".encode())) + field(4, sampling))
    write("grpc_request", "session", field(2, b"conversation-1") + field(3, turn(b"user", b"hi")))


def http_framing_seeds():
    body = b'{"prompt": "hi"}'
    write("http_framing", "get", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    write("http_framing", "post", b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n"
          b"Expect: 100-continue\r\n\r\n%s" % (len(body), body))
    write("http_framing", "chunked", b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: "
          b"gzip, chunked\r\n\r\n5;ext=1\r\n{\"pro\r\nb\r\nmpt\": \"hi\"}\r\n0\r\nX-T: 1\r\n\r\n")
    write("http_framing", "pipelined", b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n")


if __name__ == "__main__":
    gguf_seeds()
    safetensors_seeds()
    tokenizer_json_seeds()
    openai_request_seeds()
    grpc_request_seeds()
    http_framing_seeds()
