"""A tiny llama2.c model with random weights and its tokenizer, written
with numpy only (the tokenizer with the standard library alone), for the
tests of the tools and loaders that run a model: their behaviour, not the
quality of the text.

  model_fixture.py MODEL TOKENIZER [--seed S] [--seq-len N] [--layers L]
                   [--bpe [--vocab V] [--corpus FILE]]

MODEL: a version-0 llama2.c checkpoint (../shared/models/README.md): dim
32, L layers (default 2), 4 query heads on 2 KV heads (head size 8), hidden
64, shared classifier, a vocabulary of the tokenizer's size.

TOKENIZER, by default: <unk>, <s>, </s>, the 256 byte pieces
<0x00>..<0xFF>, then every printable ASCII character as its own piece: 354
tokens, scores 0 (no merges).

TOKENIZER with --bpe: laid out as tok512.bin is (<unk>, "\\n<s>\\n",
"\\n</s>\\n", the 256 byte pieces, then merges, then characters), V pieces
in all (default 512).  The merges are learned here by byte-pair encoding
on the corpus (default: the first 16 KiB of data/filler.txt beside this
directory, then a line of accented, Cyrillic and Japanese text): the text
is split into words, each with the space before it; the pair of adjacent
symbols that occurs most often becomes a piece (ties: the smaller pair of
strings) until, with every character of the corpus as a piece of its own,
V pieces are reached.  Merge k scores -k; the characters follow, most
frequent first, with scores continuing down.  Characters outside the
corpus are left to the byte pieces.  Deterministic: the same corpus gives
the same file.
"""
import argparse
import os
import re
import struct

EXTRA_TEXT = ("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade; "
              "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440; "
              "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8.\n")


def byte_pieces():
    return [b"<0x%02X>" % i for i in range(256)]


def learn_bpe(text, vocab):
    """Pieces after the specials and byte pieces, and their scores."""
    words = {}
    for w in re.findall(r" ?[^ \n]+|\n| ", text):
        key = tuple(w)
        words[key] = words.get(key, 0) + 1
    chars = {}
    for w, n in words.items():
        for ch in w:
            chars[ch] = chars.get(ch, 0) + n
    n_merges = vocab - 3 - 256 - len(chars)
    if n_merges < 0:
        raise SystemExit("model_fixture.py: --vocab %d is too small for the corpus's %d characters"
                         % (vocab, len(chars)))
    merges, known = [], set(chars)
    while len(merges) < n_merges:
        pairs = {}
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] = pairs.get((a, b), 0) + n
        if not pairs:
            raise SystemExit("model_fixture.py: the corpus has too few pairs for --vocab %d" % vocab)
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merged = a + b
        if merged not in known:  # a piece reached by two splits is one piece
            known.add(merged)
            merges.append(merged)
        joined = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            joined[tuple(out)] = joined.get(tuple(out), 0) + n
        words = joined
    by_count = sorted(chars, key=lambda ch: (-chars[ch], ch))
    pieces = [p.encode("utf-8") for p in merges + by_count]
    return pieces, [-float(k) for k in range(len(pieces))]


def write_tokenizer(path, pieces, scores):
    with open(path, "wb") as fp:
        fp.write(struct.pack("<i", max(len(p) for p in pieces)))
        for p, s in zip(pieces, scores):
            fp.write(struct.pack("<fi", s, len(p)) + p)


def write_model(path, vocab, layers, seq_len, seed):
    import numpy as np
    dim, hidden, heads, kv_heads = 32, 64, 4, 2
    head_dim = dim // heads
    kv_dim = kv_heads * head_dim
    rng = np.random.default_rng(seed)

    def normal(*shape, mean=0.0, sd=0.3):
        return (mean + sd * rng.standard_normal(shape)).astype("<f4")

    with open(path, "wb") as fp:
        fp.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len))
        for arr in (normal(vocab, dim, sd=1.0), normal(layers, dim, mean=1.0, sd=0.1),
                    normal(layers, dim, dim), normal(layers, kv_dim, dim), normal(layers, kv_dim, dim),
                    normal(layers, dim, dim), normal(layers, dim, mean=1.0, sd=0.1),
                    normal(layers, hidden, dim), normal(layers, dim, hidden), normal(layers, hidden, dim),
                    normal(dim, mean=1.0, sd=0.1), np.zeros((seq_len, head_dim), dtype="<f4")):
            fp.write(arr.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--bpe", action="store_true")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--corpus")
    a = ap.parse_args()
    if a.bpe:
        if a.corpus:
            with open(a.corpus, encoding="utf-8") as fp:
                text = fp.read()
        else:
            here = os.path.dirname(os.path.abspath(__file__))
            with open(os.path.join(here, "..", "data", "filler.txt"), encoding="utf-8") as fp:
                text = fp.read(16384) + EXTRA_TEXT
        learned, scores = learn_bpe(text, a.vocab)
        pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + byte_pieces() + learned
        scores = [0.0] * (3 + 256) + scores
    else:
        pieces = [b"<unk>", b"<s>", b"</s>"] + byte_pieces() + [bytes([c]) for c in range(0x20, 0x7F)]
        scores = [0.0] * len(pieces)
    write_tokenizer(a.tokenizer, pieces, scores)
    write_model(a.model, len(pieces), a.layers, a.seq_len, a.seed)


if __name__ == "__main__":
    main()
