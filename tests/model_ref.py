#!/usr/bin/python3
"""Independent reference for tests/check_model.c: a plain numpy (float64)
LLaMA forward pass and the llama2.c tokenizer, written from the format
description in ../shared/models/README.md, not from the C code.

  model_ref.py forward CHECKPOINT OUT --tokens 1,403,407 [--rope-layout
      interleaved|half] [--rope-theta T] [--rope-dim R] [--eps E] [--bias FILE]
      [--rope-scaling linear|llama3 --factor F [--low-freq-factor L
      --high-freq-factor H --original-max-pos N]]
    Writes float64 little-endian: per layer q [n_heads][T][head_dim],
    k [n_kv_heads][T][head_dim] (after RoPE), k before RoPE, v; then the
    logits [T][vocab].  --bias: float32 bq, bk, bv of each layer in turn.
    --rope-scaling: the RoPE frequencies of Hugging Face's rope_scaling of
    that type (transformers' modeling_rope_utils definitions).

  model_ref.py decode CHECKPOINT --tokens IDS --context C --score N
      [--quest PAGE,BUDGET,SINK,RECENT] [--per-token]
    Teacher-forced decoding: prefill the first C tokens with full
    attention, then one decode step per token C..C+N-1; prints the mean
    negative log-likelihood of tokens C+1..C+N, then with --per-token the
    log-probability of each of them, one per line.  --quest: keys and values
    are held in float16, the decoded tokens appended to the pages, and each
    step attends the tokens Quest selects among all of them (the page bound
    of its min/max keys, sink, recent, whole pages by score, ties to the
    lower page, the budget a share of every token so far).

  model_ref.py tokenize TOKENIZER TEXTS
    TEXTS holds strings separated by NUL bytes; prints the ids of each (BOS
    first) on one line, encoded the way llama2.c's run.c encodes.
"""
import struct
import sys

import numpy as np


def read_checkpoint(path):
    with open(path, "rb") as fp:
        data = fp.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    head_dim = dim // n_heads
    kv_dim = n_kv_heads * head_dim
    floats = np.frombuffer(data, dtype="<f4", offset=28).astype(np.float64)
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = floats[at:at + n].reshape(shape)
        at += n
        return out

    w = {
        "embedding": take(vocab, dim),
        "rms_att": take(n_layers, dim),
        "wq": take(n_layers, dim, dim),
        "wk": take(n_layers, kv_dim, dim),
        "wv": take(n_layers, kv_dim, dim),
        "wo": take(n_layers, dim, dim),
        "rms_ffn": take(n_layers, dim),
        "w1": take(n_layers, hidden, dim),
        "w2": take(n_layers, dim, hidden),
        "w3": take(n_layers, hidden, dim),
        "rms_final": take(dim),
    }
    take(seq_len, head_dim // 2)  # legacy RoPE tables, unused
    take(seq_len, head_dim // 2)
    w["classifier"] = w["embedding"] if shared else take(vocab, dim)
    assert at == floats.size, "checkpoint size does not match its header"
    shape = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads,
                 n_kv_heads=n_kv_heads, vocab=vocab, head_dim=head_dim)
    return shape, w


def rmsnorm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def inv_frequencies(theta, rope_dim, scaling):
    """Frequency of each pair: theta^(-2j/rope_dim), then, as Hugging Face
    scales it, "linear": all divided by factor; "llama3": wavelengths
    2 pi / inv shorter than orig/high kept, longer than orig/low divided by
    factor, and in between a blend by how far orig/wavelength lies from low
    to high."""
    inv = theta ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    if scaling is None:
        return inv
    kind, factor = scaling["type"], scaling["factor"]
    if kind == "linear":
        return inv / factor
    low, high, orig = scaling["low"], scaling["high"], scaling["orig"]
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, blended, scaled)


def rope(x, positions, theta, rope_dim, layout, scaling=None):
    """x: [T, heads, head_dim]; rotate pair j by pos * inv_frequencies[j]."""
    out = x.copy()
    half = rope_dim // 2
    angle = positions[:, None] * inv_frequencies(theta, rope_dim, scaling)[None, :]  # [T, half]
    cos = np.cos(angle)[:, None, :]
    sin = np.sin(angle)[:, None, :]
    if layout == "interleaved":
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    return out


def forward(shape, w, tokens, theta, rope_dim, layout, eps, biases, scaling=None):
    T = len(tokens)
    H, KV, hd = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    group = H // KV
    positions = np.arange(T, dtype=np.float64)
    x = w["embedding"][tokens]
    captured = []
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(shape["n_layers"]):
        xb = rmsnorm(x, w["rms_att"][l], eps)
        q = xb @ w["wq"][l].T
        k = xb @ w["wk"][l].T
        v = xb @ w["wv"][l].T
        if biases is not None:
            q, k, v = q + biases[l][0], k + biases[l][1], v + biases[l][2]
        q = q.reshape(T, H, hd)
        k_pre = k.reshape(T, KV, hd)
        v = v.reshape(T, KV, hd)
        q = rope(q, positions, theta, rope_dim, layout, scaling)
        k = rope(k_pre, positions, theta, rope_dim, layout, scaling)
        att = np.empty((T, H, hd))
        for h in range(H):
            s = q[:, h, :] @ k[:, h // group, :].T / np.sqrt(hd)
            s = np.where(causal, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[:, h, :] = p @ v[:, h // group, :]
        x = x + att.reshape(T, H * hd) @ w["wo"][l].T
        xb = rmsnorm(x, w["rms_ffn"][l], eps)
        gate = xb @ w["w1"][l].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * (xb @ w["w3"][l].T)) @ w["w2"][l].T
        captured.append([a.transpose(1, 0, 2) for a in (q, k, k_pre, v)])
    logits = rmsnorm(x, w["rms_final"], eps) @ w["classifier"].T
    return captured, logits


def quest_select(q_group, k16, C, page, budget, sink, recent):
    """Tokens of the cache (0..C-1) Quest attends for the queries of one
    KV head: q_group [G][hd], k16 [C][hd] in float16."""
    n = C
    want = int(np.ceil(budget * n - 1e-9)) if budget <= 1 else int(budget)
    want = min(max(want, 1), n)
    chosen = np.zeros(n, dtype=bool)
    sink_end = min(sink, n)
    chosen[:sink_end] = True
    recent_start = max(C - recent, sink_end)
    chosen[recent_start:n] = True
    if chosen.sum() >= want:
        return chosen
    k = k16.astype(np.float64)
    pages = (n - 1) // page + 1
    scores = []
    for pg in range(pages):
        block = k[pg * page:min((pg + 1) * page, n)]
        mn, mx = block.min(axis=0), block.max(axis=0)
        scores.append(max(float(np.maximum(q * mn, q * mx).sum()) for q in q_group))
    for pg in sorted(range(pages), key=lambda i: (-scores[i], i)):
        if chosen.sum() >= want:
            break
        chosen[pg * page:min((pg + 1) * page, n)] = True
    return chosen


def layer_qkv(shape, w, l, x, positions, theta, rope_dim, layout, eps):
    H, KV, hd = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    xb = rmsnorm(x, w["rms_att"][l], eps)
    q = (xb @ w["wq"][l].T).reshape(len(x), H, hd)
    k = (xb @ w["wk"][l].T).reshape(len(x), KV, hd)
    v = (xb @ w["wv"][l].T).reshape(len(x), KV, hd)
    return rope(q, positions, theta, rope_dim, layout), rope(k, positions, theta, rope_dim, layout), v


def layer_rest(w, l, x, att, eps):
    x = x + att @ w["wo"][l].T
    xb = rmsnorm(x, w["rms_ffn"][l], eps)
    gate = xb @ w["w1"][l].T
    return x + ((gate / (1.0 + np.exp(-gate))) * (xb @ w["w3"][l].T)) @ w["w2"][l].T


def decode_logprobs(shape, w, tokens, C, N, theta, rope_dim, layout, eps, quest=None):
    H, KV, hd = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    group = H // KV
    captured, logits = forward(shape, w, tokens[:C], theta, rope_dim, layout, eps, None)
    # per layer: K, V of every position so far [KV][T][hd]
    keys = [layer[1].copy() for layer in captured]
    values = [layer[3].copy() for layer in captured]
    if quest:
        keys = [np.float16(k).astype(np.float64) for k in keys]
        values = [np.float16(v).astype(np.float64) for v in values]
    logprobs = []
    for s in range(N):
        pos = C + s
        x = w["embedding"][[tokens[pos]]]
        for l in range(shape["n_layers"]):
            q, k, v = layer_qkv(shape, w, l, x, np.array([pos], dtype=np.float64), theta, rope_dim, layout, eps)
            if quest:
                k, v = np.float16(k).astype(np.float64), np.float16(v).astype(np.float64)
            keys[l] = np.concatenate([keys[l], k.transpose(1, 0, 2)], axis=1)
            values[l] = np.concatenate([values[l], v.transpose(1, 0, 2)], axis=1)
            att = np.empty((1, H, hd))
            for kvh in range(KV):
                qg = q[0, kvh * group:(kvh + 1) * group, :]
                mask = np.ones(pos + 1, dtype=bool)
                if quest:
                    page, budget, sink, recent = quest
                    mask = quest_select(qg, keys[l][kvh], pos + 1, page, budget, sink, recent)
                K, V = keys[l][kvh][mask], values[l][kvh][mask]
                for g in range(group):
                    sc = K @ qg[g] / np.sqrt(hd)
                    p = np.exp(sc - sc.max())
                    att[0, kvh * group + g] = (p / p.sum()) @ V
            x = layer_rest(w, l, x, att.reshape(1, H * hd), eps)
        out = rmsnorm(x, w["rms_final"], eps) @ w["classifier"].T
        out = out[0] - out[0].max()
        logprobs.append(out[tokens[pos + 1]] - np.log(np.exp(out).sum()))
    return logprobs


def cmd_decode(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="model_ref.py decode")
    ap.add_argument("checkpoint")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--score", type=int, required=True)
    ap.add_argument("--quest")
    ap.add_argument("--per-token", action="store_true")
    ap.add_argument("--eps", type=float, default=1e-5)
    a = ap.parse_args(argv)
    shape, w = read_checkpoint(a.checkpoint)
    tokens = [int(t) for t in a.tokens.split(",")]
    quest = None
    if a.quest:
        page, budget, sink, recent = a.quest.split(",")
        quest = (int(page), float(budget), int(sink), int(recent))
    logprobs = decode_logprobs(shape, w, tokens, a.context, a.score, 10000.0, shape["head_dim"], "interleaved",
                               np.float32(a.eps).astype(np.float64), quest)
    print("%.17g" % -np.mean(logprobs))
    if a.per_token:
        for lp in logprobs:
            print("%.17g" % lp)


def read_biases(path, shape):
    q_dim = shape["n_heads"] * shape["head_dim"]
    kv_dim = shape["n_kv_heads"] * shape["head_dim"]
    raw = np.fromfile(path, dtype="<f4").astype(np.float64)
    per = q_dim + 2 * kv_dim
    assert raw.size == per * shape["n_layers"], "bias file size does not match the model"
    out = []
    for l in range(shape["n_layers"]):
        b = raw[l * per:(l + 1) * per]
        out.append((b[:q_dim], b[q_dim:q_dim + kv_dim], b[q_dim + kv_dim:]))
    return out


def cmd_forward(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="model_ref.py forward")
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--rope-layout", choices=["interleaved", "half"], default="interleaved")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rope-dim", type=int, default=0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--bias")
    ap.add_argument("--rope-scaling", choices=["linear", "llama3"])
    ap.add_argument("--factor", type=float)
    ap.add_argument("--low-freq-factor", type=float)
    ap.add_argument("--high-freq-factor", type=float)
    ap.add_argument("--original-max-pos", type=float)
    a = ap.parse_args(argv)
    scaling = None
    if a.rope_scaling:
        scaling = dict(type=a.rope_scaling, factor=a.factor, low=a.low_freq_factor,
                       high=a.high_freq_factor, orig=a.original_max_pos)
    shape, w = read_checkpoint(a.checkpoint)
    tokens = [int(t) for t in a.tokens.split(",")]
    rope_dim = a.rope_dim or shape["head_dim"]
    biases = read_biases(a.bias, shape) if a.bias else None
    captured, logits = forward(shape, w, tokens, a.rope_theta, rope_dim, a.rope_layout,
                               np.float32(a.eps).astype(np.float64), biases, scaling)
    with open(a.out, "wb") as fp:
        for layer in captured:
            for arr in layer:
                fp.write(np.ascontiguousarray(arr, dtype="<f8").tobytes())
        fp.write(np.ascontiguousarray(logits, dtype="<f8").tobytes())


def read_tokenizer(path):
    with open(path, "rb") as fp:
        data = fp.read()
    at = 4
    pieces, scores = [], []
    while at < len(data):
        score, n = struct.unpack_from("<fi", data, at)
        pieces.append(data[at + 8:at + 8 + n])
        scores.append(score)
        at += 8 + n
    return pieces, scores


def encode(pieces, scores, text):
    """llama2.c run.c: BOS, dummy-prefix " ", UTF-8 characters (bytes + 3
    when a character is not a piece), then merge the best-scored pair,
    leftmost on ties, until no pair merges."""
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    ids = [1]
    if text:
        ids.append(lookup[b" "])
    i = 0
    while i < len(text):
        j = i + 1
        while j < len(text) and (text[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        ch = text[i:j]
        if ch in lookup:
            ids.append(lookup[ch])
        else:
            ids.extend(b + 3 for b in ch)
        i = j
    while True:
        best, best_at, best_id = -1e10, -1, -1
        for k in range(1, len(ids) - 1):
            merged = lookup.get(pieces[ids[k]] + pieces[ids[k + 1]], -1)
            if merged != -1 and scores[merged] > best:
                best, best_at, best_id = scores[merged], k, merged
        if best_at < 0:
            return ids
        ids[best_at:best_at + 2] = [best_id]


def cmd_tokenize(argv):
    pieces, scores = read_tokenizer(argv[0])
    with open(argv[1], "rb") as fp:
        texts = fp.read().split(b"\0")
    for text in texts:
        print(" ".join(str(i) for i in encode(pieces, scores, text)))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("forward", "decode", "tokenize"):
        sys.stderr.write(__doc__)
        return 2
    if sys.argv[1] == "forward":
        cmd_forward(sys.argv[2:])
    elif sys.argv[1] == "decode":
        cmd_decode(sys.argv[2:])
    else:
        cmd_tokenize(sys.argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
