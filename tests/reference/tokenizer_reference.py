#!/usr/bin/env python3
"""Expected values for the tokenizer tests (tests/unit/tokenizer; chat templates have their own
script, chat_template_reference.py).

Builds an independent Hugging Face `tokenizers` byte-level BPE tokenizer from the vocabulary and
merges stored in the GGUF model (read with the `gguf` package, not with our code) and records what
it produces.

Writes into OUT_DIR/tokenizer/:
  smollm/tokenizer.json, tokenizer_config.json   the SmolLM2 pipeline (Digits + ByteLevel regex)
  llama3/tokenizer.json, model.gguf               same vocab, Llama-3 Split regex, ignore_merges, bos
  added/tokenizer.json                            smollm plus added tokens with lstrip/rstrip etc.
  qwen2/tokenizer.json,  model.gguf               same vocab, Qwen2 Split regex
  errors/*.gguf                                   small metadata-only GGUFs that must be rejected
  cases.json                                      strings + HF ids per variant + HF decodes
"""

import argparse
import json
import lzma
import os
import random

import gguf
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors)
import jinja2
from transformers.utils.chat_template_utils import render_jinja_template

from chat_template_reference import CONVERSATIONS

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------

def read_gguf_vocab(path):
    reader = gguf.GGUFReader(path)

    def value(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    vocab = {
        "tokens": value("tokenizer.ggml.tokens"),
        "token_types": value("tokenizer.ggml.token_type"),
        "merges": value("tokenizer.ggml.merges"),
        "bos": value("tokenizer.ggml.bos_token_id"),
        "eos": value("tokenizer.ggml.eos_token_id"),
        "unk": value("tokenizer.ggml.unknown_token_id"),
        "pad": value("tokenizer.ggml.padding_token_id"),
        "chat_template": value("tokenizer.chat_template", ""),
    }
    assert len(set(vocab["tokens"])) == len(vocab["tokens"]), "duplicate tokens in the GGUF vocab"
    return vocab


def build_hf_tokenizer(vocab, variant):
    tokens = vocab["tokens"]
    merges = [tuple(m.split(" ", 1)) for m in vocab["merges"]]
    model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                       ignore_merges=(variant == "llama3"))
    tok = Tokenizer(model)
    if variant == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        regex = LLAMA3_REGEX if variant == "llama3" else QWEN2_REGEX
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if variant == "llama3":
        bos = tokens[vocab["bos"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab["bos"])])
    tok.decoder = decoders.ByteLevel()
    added = []
    for i, (text, ttype) in enumerate(zip(tokens, vocab["token_types"])):
        if ttype in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            special = ttype == TOKEN_TYPE_CONTROL
            added.append(AddedToken(text, special=special, normalized=not special))
    tok.add_tokens(added)
    for a in added:
        assert tok.token_to_id(a.content) == tokens.index(a.content)
    return tok


def add_extra_tokens(tok):
    """Added tokens exercising lstrip/rstrip, the normalized pass, and HF's decode of added tokens
    whose text is not byte-level ("café" decodes to "caf\ufffd" in HF)."""
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True,
                                       normalized=False)])
    tok.add_tokens([AddedToken(" world", normalized=True, special=False),
                    AddedToken("café", normalized=False, special=False),
                    AddedToken("<|im", normalized=True, special=False)])
    return tok


def write_gguf(path, vocab, pre, add_bos, *, model="gpt2", with_merges=True):
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_types"])
    if with_merges:
        writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def train_sentencepiece(model_type):
    """A SentencePiece model (byte fallback, identity normalization, dummy prefix: Llama 2's
    settings) trained on wikitext."""
    import io
    import sentencepiece as spm
    with open("/work/shared/data/ppl/wikitext-2-raw-v1_test.raw", encoding="utf-8") as f:
        lines = [line for line in f.read()[:600000].split("\n") if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=3000, model_type=model_type,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_tokenizer_json(sp, model_type):
    """HF's form of a SentencePiece model (as its converter writes one): Unigram with the scores,
    or BPE with byte fallback and a merge for every split of a piece into two pieces, ranked by
    the piece; "▁" escaping by normalizers; special <unk>, <s>, </s>."""
    pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
    if model_type == "unigram":
        model = models.Unigram([(p, sp.get_score(i)) for i, p in enumerate(pieces)], unk_id=0,
                               byte_fallback=True)
    else:
        vocab = {p: i for i, p in enumerate(pieces)}
        merges = []
        for piece, pid in vocab.items():
            if sp.is_byte(pid) or sp.is_control(pid) or sp.is_unknown(pid):
                continue
            for k in range(1, len(piece)):
                left, right = piece[:k], piece[k:]
                if left in vocab and right in vocab:
                    merges.append((left, right, pid))
        merges.sort(key=lambda m: (m[2], vocab[m[0]], vocab[m[1]]))
        model = models.BPE(vocab=vocab, merges=[(l, r) for l, r, _ in merges], unk_token="<unk>",
                           byte_fallback=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False)
                            for p in ("<unk>", "<s>", "</s>")])
    return tok


def write_sentencepiece(out_dir):
    """The SentencePiece BPE model written as llama.cpp's converter writes it into a GGUF
    (tokenizer.ggml.model = llama). Returns the model, the reference encoder."""
    sp = train_sentencepiece("bpe")
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
             else 5 if sp.is_unused(i) else 1 for i in range(sp.vocab_size())]
    writer = gguf.GGUFWriter(os.path.join(out_dir, "model.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(sp.vocab_size())])
    writer.add_token_scores([sp.get_score(i) for i in range(sp.vocab_size())])
    writer.add_token_types(types)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sp


def tiny_vocab():
    """256 byte tokens + a few merges: enough for the loaders' error paths."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>"] + alphabet + ["he", "ll", "hell", "hello"]
    return {"tokens": tokens, "token_types": [TOKEN_TYPE_CONTROL] + [1] * (len(tokens) - 1),
            "merges": ["h e", "l l", "he ll", "hell o"], "bos": 0, "eos": 0}


# --------------------------------------------------------------------------------------------
# Strings
# --------------------------------------------------------------------------------------------

HANDWRITTEN = [
    # Unicode normalization: decomposed and composed forms, compatibility characters.
    "cafe\u0301 vs caf\u00e9", "A\u030a ngstr\u00f6m \u212b", "\ufb01ne \ufb02ow", "\u2460\u2461 \u00bd",
    "\uff21\uff22\uff23 full width", "\u1100\u1161\u11a8 \uac01", "e\u0301\u0323 stacked marks",
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\n\n\n", " \n ", "\t\t\tx", "x\t\t",
    "a", "A", "hello", " hello", "  hello", "hello ", "hello  ", "Hello, world!", "Hello world! 123",
    "The capital of France is", "Hello, we can use", "  multiple   spaces  between   words  ",
    "I'm", "don't", "they're", "we've", "she'll", "he'd", "it's", "IT'S", "DON'T", "'s", "'t",
    "'re'll've'm'd", "rock 'n' roll", "O'Neil's", "x's'S'", "’s curly apostrophe’s",
    "0", "7", "42", "123", "1234", "12345678901234567890", " 42", "3.14159", "1,000,000", "-273.15",
    "v1.2.3", "0x1F600", "1e-9", "٣٤٥ arabic-indic", "²³ superscripts", "½ ¼", "Ⅻ roman", "①②③",
    "你好，世界", "こんにちは世界", "안녕하세요", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε", "Ελληνικά ΑΒΓ", "Tiếng Việt có dấu",
    "😀", "😀😀😀", "👨‍👩‍👧‍👦 family", "🇺🇸🇫🇷 flags", "👍🏽 skin tone", "I ❤️ NY", "🤖 robots 🤖",
    "e\u0301 combining acute", "Z\u0324\u0354\u0367\u0311a\u0308\u0356l\u036e\u0312g\u0301o zalgo",
    "a\u00a0b nbsp", "a\u2028b line sep", "a\u3000b ideographic space", "a\u0085b nel", "hi  \u0085",
    "hi  \u180e mongolian", "a\u200bb zwsp", "\ufeffbom", "a\x0bb\x0cc", "hi  \x1c", "\x00nul\x00",
    "\x7fdel", "\x01\x02\x03", "tab\there", "crlf\r\nline\r\n", "\r\r\n\n", " \t \n \r\n ",
    "def f(x):\n    return x * 2\n", "int main() {\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>", "SELECT * FROM t WHERE id = 5;",
    "https://example.com/path?query=1&other=two#frag", "user@example.com", "C:\\Windows\\System32",
    "∑∫√∞≠≤≥ math", "x² + y² = z²", "→ ← ↑ ↓ arrows", "«quotes» „German“ ‘single’",
    "<|im_start|>user\nhi<|im_end|>", "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "<|endoftext|>", "text<|endoftext|>more text", "<|im_end|><|im_start|>", "<|im_start|",
    "<<|im_start|>>", "<|im_start|><|im_start|>", "<filename>foo.py<file_sep>print(1)",
    " <|im_start|> spaced ", "<|im_start|>assistant\n", "<jupyter_code>x = 1<jupyter_output>1",
    "<|IM_START|> wrong case", "<repo_name><reponame>", "<|im_start|>user\n你好<|im_end|>\n",
    "x <mask> y", "  <mask>  ", "a\u3000<mask>\u3000b", "hello world", "world world  world",
    "café au lait", "un café, deux cafés", "<|im <|im_start|> <|im_end", "<|im<|im<|im_start|>",
    "a" * 1000, " " * 500, "ab" * 300, "\n" * 100, "x " * 200, "9" * 200, "😀" * 100,
    "Supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ", "ﬁ ligature", "Å Ω K ß ẞ ſ", "ΣΑΣ σας", "İstanbul ı",
    # Case-insensitive contractions under Unicode case folding (long s, Kelvin sign).
    "it'ſ x'K y'Ｓ z'Ş", "IT'S WE'RE THEY'LL I'M YOU'VE HE'D",
    # Recently assigned code points (Unicode 15: CJK Ext. H, Kawi; Unicode 14: Vithkuqi).
    "\U00031350\U00031351 ext-h", "\U00011F04\U00011F05 kawi", "\U00010570\U00010597 vithkuqi",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " ",
    "  \t\n\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÉÎÕÜ",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "あいうえおかきくけこアイウエオ",
    "😀😂🥲😍🤔👍🔥🎉🚀💡",
    "مرحباالعربية",
    "\u0301\u0308\u0327\u0323\u20dd",
    "\u00a0\u2028\u3000\u0085\u200b\u2009",
    "٠١٢٣٤٥٦٧٨٩²½",
]
FRAGMENTS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "<|im_start|>", "<|im_end|>",
             "<|endoftext|>", "\r\n", "    ", "http://", "```", "...", " the", " and"]


def random_string(rng):
    out = []
    for _ in range(rng.randint(1, 60)):
        if rng.random() < 0.08:
            out.append(rng.choice(FRAGMENTS))
        else:
            out.append(rng.choice(rng.choice(POOLS)))
    return "".join(out)


def wikitext_strings(path, rng, count):
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n")]
    nonempty = [i for i, line in enumerate(lines) if line.strip()]
    out = []
    for _ in range(count):
        i = rng.choice(nonempty)
        span = rng.choice([1, 1, 1, 2, 3, 5])
        out.append("\n".join(lines[i:i + span])[:6000])
    return out


def sharegpt_strings(path, rng, count):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        convs = json.load(f)
    values = [turn["value"] for conv in convs for turn in conv.get("conversations", [])
              if isinstance(turn.get("value"), str) and turn["value"]]
    out = [v[:4000] for v in rng.sample(values, count)]
    # A few whole conversations in ChatML form (special tokens inside real text).
    for conv in rng.sample(convs, 40):
        parts = []
        for turn in conv.get("conversations", [])[:4]:
            role = {"human": "user", "gpt": "assistant"}.get(turn.get("from"), "system")
            parts.append(f"<|im_start|>{role}\n{turn.get('value', '')[:1500]}<|im_end|>\n")
        out.append("".join(parts))
    return out


def build_strings(rng):
    strings = list(HANDWRITTEN)
    strings += [random_string(rng) for _ in range(700)]
    strings += wikitext_strings("/work/shared/data/ppl/wikitext-2-raw-v1_test.raw", rng, 650)
    strings += sharegpt_strings("/work/shared/data/sharegpt/sharegpt_v3_sample1000.json.xz", rng,
                                650)
    # One long document (many pre-tokens) to exercise the encoder beyond short prompts.
    with open("/work/shared/data/ppl/wikitext-2-raw-v1_test.raw", encoding="utf-8") as f:
        strings.append(f.read()[:30000])
    return strings


# --------------------------------------------------------------------------------------------
# Chat templates
# --------------------------------------------------------------------------------------------

def rendered_prompts(template, bos, eos):
    """The default model's chat prompts over the chat-template conversations: realistic encoder
    inputs."""
    out = []
    for messages in CONVERSATIONS:
        for agp in (False, True):
            try:
                rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                                    add_generation_prompt=agp,
                                                    bos_token=bos, eos_token=eos)
                out.append(rendered[0])
            except jinja2.exceptions.TemplateError:
                pass
    return out


# --------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()

    out = os.path.join(args.out_dir, "tokenizer")
    os.makedirs(os.path.join(out, "errors"), exist_ok=True)
    vocab = read_gguf_vocab(args.model)
    rng = random.Random(20240607)
    strings = build_strings(rng)
    # Rendered SmolLM prompts are realistic encoder inputs too.
    strings += rendered_prompts(vocab["chat_template"], "<|im_start|>", "<|im_end|>")

    variants = {}
    for name in ("smollm", "llama3", "qwen2", "added", "qwen2_nfc", "qwen2_nfkc"):
        tok = build_hf_tokenizer(vocab, {"added": "smollm", "qwen2_nfc": "qwen2",
                                         "qwen2_nfkc": "qwen2"}.get(name, name))
        if name == "added":
            add_extra_tokens(tok)
        if name == "qwen2_nfc":  # real Qwen2 directories normalize with NFC
            tok.normalizer = normalizers.NFC()
        if name == "qwen2_nfkc":
            tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.NFKC()])
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))
        encodings = tok.encode_batch(strings, add_special_tokens=False)
        entry = {"ids": [e.ids for e in encodings]}
        if name in ("smollm", "added"):
            entry["decoded"] = tok.decode_batch(entry["ids"], skip_special_tokens=False)
            entry["decoded_skip_special"] = tok.decode_batch(entry["ids"], skip_special_tokens=True)
        if name == "llama3":
            entry["ids_with_bos"] = [e.ids for e in
                                     tok.encode_batch(strings[:50], add_special_tokens=True)]
        variants[name] = entry

    os.makedirs(os.path.join(out, "spm"), exist_ok=True)
    sp = write_sentencepiece(os.path.join(out, "spm"))
    variants["spm"] = {"ids": [sp.encode(s) for s in strings],
                       "decoded": [sp.decode(sp.encode(s)) for s in strings]}
    # The same SentencePiece models as HF tokenizer.json files, against HF's tokenizers.
    for name, model_type, model in (("spm_bpe_json", "bpe", sp),
                                    ("spm_unigram_json", "unigram", train_sentencepiece("unigram"))):
        tok = sentencepiece_tokenizer_json(model, model_type)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))
        variants[name] = {"ids": [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)],
                          "sentencepiece_ids": [model.encode(s) for s in strings]}

    with open(os.path.join(out, "smollm", "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": vocab["chat_template"],
                   "bos_token": vocab["tokens"][vocab["bos"]],
                   "eos_token": {"content": vocab["tokens"][vocab["eos"]], "special": True},
                   "add_bos_token": False}, f, ensure_ascii=False, indent=1)
    write_gguf(os.path.join(out, "llama3", "model.gguf"), vocab, "llama-bpe", True)
    write_gguf(os.path.join(out, "qwen2", "model.gguf"), vocab, "qwen2", False)

    tiny = tiny_vocab()
    write_gguf(os.path.join(out, "errors", "ok.gguf"), tiny, "gpt-2", False)
    write_gguf(os.path.join(out, "errors", "unknown_pre.gguf"), tiny, "no-such-pre", False)
    write_gguf(os.path.join(out, "errors", "llama_model.gguf"), tiny, "gpt-2", False, model="llama")
    write_gguf(os.path.join(out, "errors", "bert_model.gguf"), tiny, "gpt-2", False, model="bert")
    write_gguf(os.path.join(out, "errors", "missing_merges.gguf"), tiny, "gpt-2", False,
               with_merges=False)
    bad = dict(tiny, merges=tiny["merges"] + ["x zz"])
    write_gguf(os.path.join(out, "errors", "bad_merge.gguf"), bad, "gpt-2", False)

    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"strings": strings, "variants": variants}, f, ensure_ascii=False)
    print(f"wrote {len(strings)} strings to {out}")


if __name__ == "__main__":
    main()
