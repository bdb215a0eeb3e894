#!/usr/bin/env python3
"""Needle in a haystack: long-context retrieval prompts for `strata bench ... --workload longqa`.

generate: writes a .jsonl of BAMBOO-layout records ({"content", "question", "answer"}): a
haystack of Paul Graham essays (shared data, needle_haystack/) cut to exactly --context-tokens
tokens of the served model's tokenizer, with a needle sentence carrying a random 7-digit number
inserted at each --depths fraction of it (RULER's "special magic number" needle). Every record
shares the haystack, so records sorted by decreasing depth share their longest prefixes: a KV
store holding the first one's prompt serves the next ones' documents up to their needles.
With --keys K (RULER's multi-key variant) one document holds K needles, each a number for its own
key word, at depths (i + 1/2) / K, and record i asks for key i's number: the other K - 1 needles
are distractors, and every record has the same document, so a KV store holding the first prompt
serves the whole document to the others (one long prefill for K questions).

score: reads a `strata bench compare` compare.json of such a workload and prints, per variant,
the share of answers that contain the needle's number (the retrieval accuracy), beside the
token F1 the bench computes, how many answers equal the reference variant's, the mean time
per output token and FreeKV's counters: the share of head steps corrected, the (page, KV head)
copies per layer step from the host pages and from the other recall buffer, and the share of
recall time hidden behind compute.

    .venv/bin/python bench/niah.py generate --model .cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --context-tokens 32000 --depths 0.75,0.25 --output /var/tmp/niah-32k.jsonl
    .venv/bin/python bench/niah.py generate --model ... --context-tokens 16000 --keys 16 \
        --output /var/tmp/niah-16k-keys.jsonl
    .venv/bin/python bench/niah.py score docs/results/cpu-freekv-niah/compare.json --reference full
"""

import argparse
import json
import pathlib
import random
import sys

QUESTION = "What is the special magic number mentioned in the document?"
# --keys: RULER's multi-key needles, keyed by words no essay sentence pairs with a number.
KEYS = ("amber", "falcon", "harbor", "violet", "quartz", "meadow", "lantern", "glacier",
        "saffron", "compass", "orchid", "ember", "tundra", "cobalt", "willow", "marble",
        "cinder", "juniper", "beacon", "thistle", "canyon", "pepper", "nimbus", "garnet",
        "hazel", "onyx", "prairie", "sparrow", "topaz", "velvet", "zephyr", "walnut")


def needle(number):
    return f" The special magic number is: {number}. Remember it. "


def keyed_needle(key, number):
    return f" One of the special magic numbers for {key} is: {number}. "


def keyed_question(key):
    return f"What is the special magic number for {key} mentioned in the document?"


def load_tokenizer(model):
    from transformers import AutoTokenizer  # the project's .venv has it

    path = pathlib.Path(model)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def generate(args):
    tokenizer = load_tokenizer(args.model)
    essays = sorted(pathlib.Path(args.haystack).glob("*.txt"))
    if not essays:
        sys.exit(f"no .txt essays in {args.haystack}")
    text, ids = "", []
    while len(ids) < args.context_tokens:  # the essays in name order, repeated if need be
        for essay in essays:
            text += essay.read_text(encoding="utf-8") + "\n\n"
        ids = tokenizer.encode(text, add_special_tokens=False)
    ids = ids[: args.context_tokens]
    rng = random.Random(args.seed)
    if args.keys:
        return generate_keyed(args, tokenizer, ids, rng)
    depths = sorted((float(d) for d in args.depths.split(",")), reverse=True)
    with open(args.output, "w", encoding="utf-8") as out:
        for depth in depths:
            if not 0 <= depth <= 1:
                sys.exit(f"depth {depth} is not in [0, 1]")
            number = rng.randrange(1_000_000, 10_000_000)
            cut = round(depth * len(ids))
            content = (tokenizer.decode(ids[:cut]) + needle(number) + tokenizer.decode(ids[cut:]))
            record = {"id": f"depth-{depth:g}", "content": content, "question": QUESTION,
                      "answer": str(number)}
            out.write(json.dumps(record) + "\n")
    print(f"{len(depths)} records of {len(ids)} haystack tokens -> {args.output}")


def generate_keyed(args, tokenizer, ids, rng):
    if not 1 <= args.keys <= len(KEYS):
        sys.exit(f"--keys must be in [1, {len(KEYS)}]")
    numbers = rng.sample(range(1_000_000, 10_000_000), args.keys)
    cuts = [round((i + 0.5) / args.keys * len(ids)) for i in range(args.keys)]
    pieces, begin = [], 0
    for key, number, cut in zip(KEYS, numbers, cuts):
        pieces += [tokenizer.decode(ids[begin:cut]), keyed_needle(key, number)]
        begin = cut
    content = "".join(pieces) + tokenizer.decode(ids[begin:])
    with open(args.output, "w", encoding="utf-8") as out:
        for i, (key, number) in enumerate(zip(KEYS, numbers)):
            record = {"id": f"key-{key}-depth-{(i + 0.5) / args.keys:g}", "content": content,
                      "question": keyed_question(key), "answer": str(number)}
            out.write(json.dumps(record) + "\n")
    print(f"{args.keys} records, one document of {len(ids)} haystack tokens and {args.keys} "
          f"needles -> {args.output}")


def score(args):
    data = json.load(open(args.compare, encoding="utf-8"))
    runs = data["runs"]
    answers = {}
    for run in runs:
        answers[run["variant"]] = run["result"]["items"]
    reference = answers.get(args.reference)
    print("| variant | needle found | token F1 | answers equal to " + args.reference +
          "'s | TPOT (ms) | corrected | (page, head) copies per layer step: host / reused "
          "| recall hidden |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for run in runs:
        name, rows = run["variant"], answers[run["variant"]]
        tpot = run["result"].get("mean_tpot_ms")
        found = sum(1 for r in rows if any(a in (r.get("prediction") or "") for a in r["answers"]))
        f1 = sum(r.get("f1") or 0 for r in rows) / max(1, len(rows))
        same = "-"
        if reference is not None:
            same = sum(1 for r, q in zip(rows, reference) if r.get("prediction") == q.get("prediction"))
            same = f"{same} / {len(rows)}"
        tpot = "-" if tpot is None else f"{tpot:.1f}"
        retrieval = ""
        counts = run["result"].get("freekv")
        if counts and counts.get("steps"):
            steps = counts["steps"]  # layer steps of the retrieval layers
            retrieval = (f" {100 * counts['corrected_share']:.1f}% | "
                         f"{counts['recalled_pages'] / steps:.1f} / "
                         f"{counts['reused_pages'] / steps:.1f} | "
                         f"{100 * counts['recall_hidden_share']:.0f}% |")
        else:
            retrieval = " | | |"
        print(f"| {name} | {found} / {len(rows)} | {f1:.3f} | {same} | {tpot} |{retrieval}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True, help="the served GGUF (its tokenizer counts tokens)")
    g.add_argument("--haystack", default="../shared/data/needle_haystack/PaulGrahamEssays")
    g.add_argument("--context-tokens", type=int, required=True, help="haystack tokens per record")
    g.add_argument("--depths", default="0.75,0.25", help="needle positions, fractions of the haystack")
    g.add_argument("--keys", type=int, default=0,
                   help="K keyed needles in one document, a question for each (replaces --depths)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--output", required=True)
    s = sub.add_parser("score")
    s.add_argument("compare", help="compare.json of a longqa workload over generate's records")
    s.add_argument("--reference", default="full")
    args = parser.parse_args()
    generate(args) if args.command == "generate" else score(args)


if __name__ == "__main__":
    main()
