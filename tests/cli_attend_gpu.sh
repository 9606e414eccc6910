#!/bin/sh
# mkv-attend --device gpu against the CPU reference on the bundled real dump
# (data/sample.h5: SmolLM2-135M, float16, head_dim 64, 3 query heads per KV
# head, 64 queries at the end of 2029 tokens), compressed with full, quest,
# mosaic (dynamic strategy, one segment per head), mosaic (fixed strategy,
# groups of 2 channels, segments of 512 tokens) and uniform2d (the same r
# first rotated channels for every vector: the packed kernel without
# bitmaps).
#
# --check-cpu makes mkv-attend answer every (query, layer, query head) with
# both devices: where both attended the same tokens, the GPU output must be
# within 1e-4 (relative L2) of the CPU's (the bound for float32
# inputs; the stored 16-bit values are the same on both sides); the token
# counts may differ only where a block or page scores at the selection
# threshold (at most 2% of the rows for quest, mosaic and uniform2d, none for
# full).
# The GPU table must also match the plain CPU table row by row: same rows,
# same recall and bytes_read where the tokens agree, rel_l2 within 1e-4.
# --device auto must pick the GPU for each of these methods (the summary's
# device column, the -v line, no fallback message); for kivi, which has no
# GPU path, it falls back to the CPU with a message.
# Skips (77) without the tools or without a usable GPU.
. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_attend_gpu mkv-compress mkv-attend
SAMPLE=$top_srcdir/data/sample.h5
TOL=1e-4
[ -r "$SAMPLE" ] || { echo "SKIP: no $SAMPLE"; exit 77; }
# MKV_ATTEND_WRAPPER: a command that every mkv-attend runs under (scripts/bench-gpu
# --sanitize sets compute-sanitizer there).
if [ -n "${MKV_ATTEND_WRAPPER:-}" ]; then
    printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$MKV_ATTEND_WRAPPER" "$ATTEND" >attend-wrapper &&
        chmod +x attend-wrapper && ATTEND=$tmp/attend-wrapper || exit 1
fi

"$COMPRESS" -q "$SAMPLE" -o c-full.h5 -m full || { echo "FAIL: compress full"; exit 1; }
if ! "$ATTEND" -q c-full.h5 --device gpu --summary >probe.tsv 2>probe.err; then
    if grep -q -e 'no CUDA' -e 'no GPU' -e 'not a target' probe.err; then
        echo "SKIP: $(cat probe.err)"
        exit 77
    fi
    echo "FAIL: mkv-attend --device gpu: $(cat probe.err)"
    exit 1
fi

"$COMPRESS" -q "$SAMPLE" -o c-quest.h5 -m quest || fail "compress quest"
"$COMPRESS" -q "$SAMPLE" -o c-mosaic.h5 -m mosaic || fail "compress mosaic"
"$COMPRESS" -q "$SAMPLE" -o c-mosaic512.h5 -m mosaic -P segment=512 -P strategy=fixed -P group=2 ||
    fail "compress mosaic (fixed, g=2, S=512)"
"$COMPRESS" -q "$SAMPLE" -o c-uniform2d.h5 -m uniform2d || fail "compress uniform2d"

for m in full quest mosaic mosaic512 uniform2d; do
    if ! "$ATTEND" -q c-$m.h5 --device gpu --check-cpu -o gpu-$m.tsv 2>err; then
        fail "$m: mkv-attend --device gpu: $(cat err)"
        continue
    fi
    "$ATTEND" -q c-$m.h5 --device cpu -o cpu-$m.tsv || { fail "$m: mkv-attend --device cpu"; continue; }
    max_differ=0
    [ $m = full ] || max_differ=0.02
    # GPU vs CPU outputs, row by row
    if report=$(awk -F'\t' -v tol=$TOL -v maxd=$max_differ '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        {
            rows++
            if ($col["tokens"] != $col["cpu_tokens"]) { differ++; next }
            d = $col["cpu_rel_diff"] + 0
            if (d > worst) worst = d
            if (!(d <= tol)) { bad++; if (bad <= 3) print "row " NR - 1 ": cpu_rel_diff " d > "/dev/stderr" }
        }
        END {
            printf "%d rows, %d with other tokens, worst difference %.2e", rows, differ, worst
            exit !(rows > 0 && bad == 0 && differ <= maxd * rows)
        }' gpu-$m.tsv); then
        pass
    else
        fail "$m: GPU vs CPU outputs: $report"
    fi
    echo "$m: $report"
    # the GPU table against the plain CPU table
    if cmp_report=$(awk -F'\t' -v tol=$TOL '
        FNR == 1 { next }
        NR == FNR { key[FNR] = $1 FS $2 FS $3 FS $4 FS $5; rel[FNR] = $6; rec[FNR] = $7; tok[FNR] = $8; byt[FNR] = $9; n = FNR; next }
        {
            if ($1 FS $2 FS $3 FS $4 FS $5 != key[FNR]) { bad++; next }
            if ($8 != tok[FNR]) next
            dr = $6 - rel[FNR]; if (dr < 0) dr = -dr
            dc = $7 - rec[FNR]; if (dc < 0) dc = -dc
            if (dr > tol * (1 + rel[FNR]) || dc > 2e-6 || $9 != byt[FNR]) {
                bad++; if (bad <= 3) print "row " FNR - 1 ": rel_l2 " $6 " vs " rel[FNR] ", recall " $7 " vs " rec[FNR] ", bytes " $9 " vs " byt[FNR] > "/dev/stderr"
            }
            m++
        }
        END { printf "%d rows compared", m; exit !(m > 0 && bad == 0 && m >= n / 2) }' cpu-$m.tsv gpu-$m.tsv); then
        pass
    else
        fail "$m: GPU table vs CPU table: $cmp_report"
    fi
    "$ATTEND" -q c-$m.h5 --device gpu --summary >sum.tsv || fail "$m: --summary"
    if awk -F'\t' 'NR == 2 { exit !($3 == "gpu") }' sum.tsv; then pass; else fail "$m: the summary's device is not gpu"; fi
    # auto picks the GPU where it can: the summary's device column, the -v
    # line (tools/mkv-attend.c: "..., N threads on the CPU, attention on the
    # GPU") and no "...; attending on the CPU" fallback message
    "$ATTEND" -v c-$m.h5 --device auto --summary >sum.tsv 2>err || fail "$m: mkv-attend --device auto: $(cat err)"
    if awk -F'\t' 'NR == 2 { exit !($3 == "gpu") }' sum.tsv && grep -q ', attention on the GPU$' err &&
        ! grep -q 'attending on the CPU' err; then
        pass
    else
        fail "$m: --device auto did not pick the GPU: device $(awk -F'\t' 'NR == 2 { print $3 }' sum.tsv); $(cat err)"
    fi
done

# A method without a GPU path: auto falls back to the CPU and says so.
"$COMPRESS" -q "$SAMPLE" -o c-kivi.h5 -m kivi || fail "compress kivi"
"$ATTEND" c-kivi.h5 --summary >sum.tsv 2>err || fail "kivi: mkv-attend (auto)"
if grep -q "has no GPU path; attending on the CPU" err && awk -F'\t' 'NR == 2 { exit !($3 == "cpu") }' sum.tsv; then
    pass; else fail "kivi: auto did not fall back with a message: $(cat err)"; fi
"$ATTEND" -q c-kivi.h5 --device gpu --summary >/dev/null 2>err
status=$?
if [ $status -eq 1 ] && grep -q "method 'kivi' has no GPU path" err; then pass; else
    fail "kivi --device gpu: status $status, $(cat err)"; fi

cli_finish
