"""An independent re-implementation of the method "cam" (CaM, Zhang et al.,
ICML 2024; the rule in the top comment of lib/methods/cam.c) in numpy,
checked against what mkv-compress stores and mkv-attend answers, read
with h5py:

  cam_ref.py store RAW.h5 C.h5
      every array of every (layer, KV head): the kept keys, the values with
      the evicted ones merged in by the sliding window (scores from the
      dump's last queries, the merge draws from mkv_rng's streams, written
      again in turboquant_ref.py), the window's scores; the byte count by
      hand. Prints "merged rows: N", the kept rows whose value differs from
      the token's own (so that a test can tell merging happened).
  cam_ref.py attend TABLE.tsv RAW.h5 C.h5
      every row of mkv-attend's table: attention over the keys and values
      computed here against exact attention over RAW (rel_l2), the
      attention mass of the kept tokens (recall), their count and the bytes
      read by hand.

Exit status 0 when everything holds, 1 with a message per failure.
"""
import math
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from turboquant_ref import Rng, read_table  # noqa: E402  (mkv_rng's streams, the table)

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def params_of(f):
    text = f.attrs["params"]
    text = text.decode() if isinstance(text, bytes) else str(text)
    return dict(kv.split("=", 1) for kv in text.split())


def budget(x, n):
    """A fraction (<= 1) of n rounded up, or a count; clamped to 1..n."""
    k = math.ceil(x * n - 1e-9) if x <= 1 else int(x)
    return max(1, min(n, k))


def to_f16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def softmax(s):
    p = np.exp(s - s.max())
    return p / p.sum()


def observation_scores(k, q_group, qpos, window):
    """Sum over the group's heads and the last `window` queries of their
    softmax weights over tokens 0..pos."""
    T, D = k.shape
    score = np.zeros(T)
    W = q_group.shape[1]
    for w in range(W - min(window, W), W):
        pos = int(qpos[w])
        for qg in q_group[:, w]:
            score[:pos + 1] += softmax(k[:pos + 1] @ qg / np.sqrt(D))
    return score


def compress(p, k, v, q_group, qpos, layer, head):
    """What cam keeps of one (layer, KV head): kept positions, values (all
    T rows, merged), scores, start', recent'."""
    T = k.shape[0]
    n = budget(float(p["keep"]), T)
    start = int(math.floor(float(p["start"]) * n))
    recent = n - start
    m = budget(float(p["merge"]), recent)
    score = observation_scores(k, q_group, qpos, int(p["window"]))
    vals = to_f16(v)
    for t in range(start, T - recent):
        recv = score[t + 1:t + 1 + m]
        mean = recv.mean()
        prob = score[t] / mean if mean > 0 else (1.0 if score[t] > 0 else 0.0)
        if Rng(int(p["seed"]), [layer, head, t]).uniform() < prob:
            vals[t + 1:t + 1 + m] = to_f16(vals[t + 1:t + 1 + m] + vals[t] / m)
    kept = list(range(start)) + list(range(T - recent, T))
    return kept, vals, score, start, recent


def head_bytes(start, recent, D):
    return (start + recent) * 2 * D * 2 + recent * 4


def read_raw(r, l, kind):
    return r["layers/%02d/%s" % (l, kind)][()].astype(np.float64)


def each_head(r, f):
    """(l, h, G, k, v, q of the group, query positions, group of C) per KV head."""
    L, H, KVH = (int(r.attrs[a]) for a in ("n_layers", "n_heads", "n_kv_heads"))
    G = H // KVH
    qpos = r["query_pos"][()]
    for l in range(L):
        k_all, v_all, q_all = read_raw(r, l, "k"), read_raw(r, l, "v"), read_raw(r, l, "q")
        for h in range(KVH):
            yield l, h, G, k_all[h], v_all[h], q_all[h * G:(h + 1) * G], qpos, f["layers/%02d/%02d" % (l, h)]


def cmd_store(raw, path):
    with h5py.File(raw, "r") as r, h5py.File(path, "r") as f:
        check(f.attrs["method"] in (b"cam", "cam"), "method is %r" % f.attrs["method"])
        p = params_of(f)
        total = 0
        merged_rows = 0
        for l, h, G, k, v, qg, qpos, g in each_head(r, f):
            where = "layer %d head %d" % (l, h)
            D = k.shape[1]
            kept, vals, score, start, recent = compress(p, k, v, qg, qpos, l, h)
            check(set(g.keys()) == {"k", "v", "score"}, "%s: arrays %s" % (where, sorted(g.keys())))
            check(int(g.attrs["start_tokens"]) == start and int(g.attrs["recent_tokens"]) == recent,
                  "%s: start/recent %s/%s, numpy %d/%d" % (where, g.attrs["start_tokens"],
                                                           g.attrs["recent_tokens"], start, recent))
            check(g["k"].dtype == np.float16 and g["v"].dtype == np.float16 and g["score"].dtype == np.float32,
                  "%s: types %s %s %s" % (where, g["k"].dtype, g["v"].dtype, g["score"].dtype))
            check(np.array_equal(g["k"][()].astype(np.float64), to_f16(k[kept])), "%s: keys differ" % where)
            got_v = g["v"][()].astype(np.float64)
            differ = int((got_v != vals[kept]).any(axis=1).sum()) if got_v.shape == vals[kept].shape else -1
            check(differ == 0, "%s: %d of %d value rows differ" % (where, differ, len(kept)))
            merged_rows += int((vals[kept] != to_f16(v[kept])).any(axis=1).sum())
            got_s = g["score"][()].astype(np.float64)
            want_s = score[k.shape[0] - recent:]
            check(got_s.shape == want_s.shape and np.allclose(got_s, want_s, rtol=1e-6, atol=1e-12),
                  "%s: scores differ" % where)
            want = head_bytes(start, recent, D)
            check(int(g.attrs["physical_bytes"]) == want,
                  "%s: physical_bytes %d, by hand %d" % (where, g.attrs["physical_bytes"], want))
            total += want
        check(int(f.attrs["physical_bytes"]) == total,
              "physical_bytes %d, by hand %d" % (f.attrs["physical_bytes"], total))
        print("merged rows: %d" % merged_rows)


def cmd_attend(table, raw, path):
    rows = read_table(table, check)
    with h5py.File(raw, "r") as r, h5py.File(path, "r") as f:
        p = params_of(f)
        heads = {}
        for l, h, G, k, v, qg, qpos, g in each_head(r, f):
            heads[(l, h)] = (G, k, v, read_raw(r, l, "q"), compress(p, k, v, qg, qpos, l, h))
        check(len(rows) == len(r["query_pos"]) * int(r.attrs["n_layers"]) * int(r.attrs["n_heads"]),
              "%d rows" % len(rows))
        for row in rows:
            w, pos, l, h, kvh = (int(x) for x in row[:5])
            G, k, v, q_all, (kept, vals, _, start, recent) = heads[(l, kvh)]
            D = k.shape[1]
            q = q_all[h, w]
            att = [t for t in kept if t <= pos]
            exact_p = softmax(k[:pos + 1] @ q / np.sqrt(D))
            exact = exact_p @ v[:pos + 1]
            got = softmax(to_f16(k[att]) @ q / np.sqrt(D)) @ vals[att]
            want = np.linalg.norm(got - exact) / np.linalg.norm(exact)
            want_recall = exact_p[att].sum()
            rel, recall, tokens, nbytes = float(row[5]), float(row[6]), int(row[7]), int(row[8])
            where = "row w=%d pos=%d l=%d h=%d" % (w, pos, l, h)
            # the tool prints 6 significant digits; its float32 output adds ~1e-7
            check(abs(rel - want) <= 1e-6 + 1e-4 * want, "%s: rel_l2 %g, numpy gives %g" % (where, rel, want))
            check(abs(recall - want_recall) <= 1e-5, "%s: recall %g, numpy gives %g" % (where, recall, want_recall))
            check(tokens == len(att), "%s: tokens %d, numpy %d" % (where, tokens, len(att)))
            check(kvh == h // G, "%s: kv_head %d" % (where, kvh))
            window_rows = sum(1 for t in att if t >= start)
            want_bytes = len(att) * 2 * D * 2 + window_rows * 4
            check(nbytes == want_bytes, "%s: bytes_read %d, by hand %d" % (where, nbytes, want_bytes))


def main(argv):
    if len(argv) == 4 and argv[1] == "store":
        cmd_store(argv[2], argv[3])
    elif len(argv) == 5 and argv[1] == "attend":
        cmd_attend(argv[2], argv[3], argv[4])
    else:
        sys.stderr.write("usage: cam_ref.py store RAW C | attend TABLE RAW C\n")
        return 2
    for msg in failures[:20]:
        sys.stderr.write("cam_ref.py: %s\n" % msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
