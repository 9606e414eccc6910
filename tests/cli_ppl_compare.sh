#!/bin/sh
# mkv-decode --ppl --per-token and scripts/ppl_compare.py on stories260K
# over data/heldout.txt: the table's perplexities, standard error and 95%
# interval recomputed in numpy from the per-token rows (which must be one
# row per scored token, in order, with the text's targets); the paired
# comparison of two runs against the same recomputation; and the
# comparison's refusals (another context, a file that is not a per-token
# table, no file, a missing file).
. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_ppl_compare mkv-decode
cli_need_h5py
STORIES=$MODELS/stories260K.bin
[ -r "$STORIES" ] || { echo "SKIP: no $STORIES (MKV_MODELS_DIR)"; exit 77; }
COMPARE=$top_srcdir/scripts/ppl_compare.py
TEXT=$top_srcdir/data/heldout.txt
run() {  # run NAME CONTEXTS METHOD PARAMS
    "$DECODE" "$STORIES" -q --ppl "$TEXT" --context "$2" --score 60 -m "$3" -P "$4" --threads 2 \
        -o "$1.tsv" --per-token "$1.tok.tsv" || { echo "FAIL: mkv-decode --ppl -m $3"; exit 1; }
}
run quest 150,300 quest budget=0.3,page=8,sink=2,recent=16
run streaming 150,300 streaming keep=0.4,sink=2
run other 150 streaming keep=0.4,sink=2

# check_table NAME: the ppl table against its per-token rows
check_table() {
    if "$PY" - "$1.tsv" "$1.tok.tsv" <<'PYEOF'; then pass; else fail "$1: the table and its per-token rows disagree"; fi
import sys, numpy as np
def table(path):
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        return [dict(zip(head, l.rstrip("\n").split("\t"))) for l in f]
rows, toks = table(sys.argv[1]), table(sys.argv[2])
ok = True
for r in rows:
    c, n = int(r["context"]), int(r["scored"])
    t = [x for x in toks if int(x["context"]) == c]
    pos = [int(x["position"]) for x in t]
    if pos != list(range(c + 1, c + n + 1)):
        print("context %d: positions %s..." % (c, pos[:3])); ok = False; continue
    lp = np.array([float(x["logprob"]) for x in t]); lf = np.array([float(x["logprob_full"]) for x in t])
    d = lf - lp
    se = d.std(ddof=1) / np.sqrt(n)
    want = {"ppl": np.exp(-lp.mean()), "ppl_full": np.exp(-lf.mean()), "nll_diff_se": se,
            "ppl_increase_pct": 100 * (np.exp(d.mean()) - 1),
            "ppl_increase_lo_pct": 100 * (np.exp(d.mean() - 1.96 * se) - 1),
            "ppl_increase_hi_pct": 100 * (np.exp(d.mean() + 1.96 * se) - 1),
            "kl": np.mean([float(x["kl"]) for x in t]),
            "agreement": np.mean([x["top1"] == x["top1_full"] for x in t])}
    if not se > 0:
        print("context %d: the method changes nothing (se %g)" % (c, se)); ok = False
    for k, v in want.items():
        got = float(r[k])
        # the table rounds: 6 digits of ppl and se, 4 decimals of percentages and agreement
        tol = 1e-5 * abs(v) + 1e-9 if k in ("ppl", "ppl_full", "nll_diff_se", "kl") else 1e-4
        if abs(got - v) > tol:
            print("context %d: %s %r, from the rows %r" % (c, k, got, v)); ok = False
sys.exit(0 if ok else 1)
PYEOF
}
check_table quest
check_table streaming

# the comparison against numpy: quest first, streaming second
if "$PY" "$COMPARE" quest.tok.tsv streaming.tok.tsv >cmp.txt 2>cmp.err &&
    "$PY" - quest.tok.tsv streaming.tok.tsv cmp.txt <<'PYEOF'; then pass; else fail "ppl_compare.py against numpy:"; sed 's/^/    /' cmp.txt cmp.err; fi
import sys, re, numpy as np
def load(path):
    a = np.genfromtxt(path, delimiter="\t", names=True)
    return {int(c): a[a["context"] == c] for c in np.unique(a["context"])}
A, B = load(sys.argv[1]), load(sys.argv[2])
lines = open(sys.argv[3]).read().splitlines()
num = r"([+-]\d+\.\d+)"
pat = re.compile(num + r"% \[" + num + ", " + num + r"\]")
want = []
for c in sorted(A):
    for run in (A, B):
        d = run[c]["logprob_full"] - run[c]["logprob"]
        want.append((c, d.mean(), d.std(ddof=1) / np.sqrt(len(d)), None))
    d = A[c]["logprob"] - B[c]["logprob"]
    want[-1] = want[-1][:3] + ((d.mean(), d.std(ddof=1) / np.sqrt(len(d))),)
if len(lines) != 1 + len(want):
    sys.exit("%d lines, want %d" % (len(lines), 1 + len(want)))
pct = lambda x: 100 * np.expm1(x)
for line, (c, m, se, diff) in zip(lines[1:], want):
    f = line.split("\t")
    if int(f[0]) != c or int(f[1]) != 60:
        sys.exit("row %r: want context %d, 60 scored" % (line, c))
    checks = [(f[3], m, se)] + ([(f[4], diff[0], diff[1])] if diff else [])
    if not diff and f[4] != "-":
        sys.exit("row %r: the first run has no difference" % line)
    if diff and not diff[1] > 0:
        sys.exit("the two runs do not differ")
    for cell, mm, ss in checks:
        g = [float(x) for x in pat.fullmatch(cell).groups()]
        w = [pct(mm), pct(mm - 1.959964 * ss), pct(mm + 1.959964 * ss)]
        if max(abs(x - y) for x, y in zip(g, w)) > 0.006:
            sys.exit("row %r: %s, want %s" % (line, g, w))
PYEOF

E=ppl_compare.py
expect "another context" 1 '' "$E: 'quest.tok.tsv' and 'other.tok.tsv' score different contexts" \
    "$PY" "$COMPARE" quest.tok.tsv other.tok.tsv
expect "not a per-token table" 1 '' "$E: 'quest.tsv' is not a --per-token table (no column position)" \
    "$PY" "$COMPARE" quest.tok.tsv quest.tsv
expect "no files" 2 '' "usage: python3 scripts/ppl_compare.py A.tsv [B.tsv ...] (--help for more)" \
    "$PY" "$COMPARE"
expect "a missing file" 1 '' "$E: cannot open 'nope.tsv': No such file or directory" \
    "$PY" "$COMPARE" quest.tok.tsv nope.tsv
cli_finish
