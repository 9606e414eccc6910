#!/bin/sh
# Golden CLI test of mkv-attend --bench.
#
# Everywhere (CI builds without CUDA and has no GPU): every misuse of the
# benchmark options gets its one-line message on stderr (the exact text of
# lib/cli/cli.c and tools/mkv-attend.c), exit status 2, nothing on stdout, and
# no output file: each case runs with -o out.tsv in an empty directory that
# must stay empty (or keep an older out.tsv unchanged).  Then --bench where
# it cannot run: a build without CUDA, or a CUDA build with every GPU hidden
# (CUDA_VISIBLE_DEVICES=-1), refuses with exit status 1 and no output.
#
# With a usable GPU (otherwise that part alone is skipped, with the reason
# mkv-attend gives): the refusal that needs the device (an output that
# cannot be created), and a tiny benchmark (4K
# tokens, batch 1, budget 0.1, every method) whose TSV is checked against
# the man page and against the synthetic shape (32 query heads, 8 KV heads,
# head_dim 128, bf16): the documented header, one row per method with status
# ok, times ordered, read_tbps = bytes_read / median_ms and frac_copy =
# read_tbps / copy_tbps within the printed rounding, the full (dense)
# kernel's bytes exactly K + V of the cache, and Quest's and mosaic's
# bytes between what their token budget must read and the dense bytes.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .).
# Exit: 0 pass, 1 fail, 77 skip (mkv-attend not built).

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_attend_bench mkv-attend
A=$ATTEND
E=mkv-attend

# refuse NAME STATUS STDERR ARG...
# Run `mkv-attend -o out.tsv ARG...` in the empty directory run/ (a later -o
# in ARG wins) and expect exit status STATUS, nothing on stdout, exactly the
# line STDERR on stderr, and run/ as it was afterwards: empty, or with
# keep=1 holding an older out.tsv, unchanged.  hide_gpus=1 runs it with
# CUDA_VISIBLE_DEVICES=-1 (no device visible to the CUDA runtime).
keep=0
hide_gpus=0
refuse() {
    name=$1 want_status=$2 want_err=$3
    shift 3
    rm -rf run && mkdir run || exit 1
    if [ $keep = 1 ]; then printf 'older output\n' >run/out.tsv; fi
    (
        cd run || exit 126
        if [ $hide_gpus = 1 ]; then
            CUDA_VISIBLE_DEVICES=-1
            export CUDA_VISIBLE_DEVICES
        fi
        exec "$A" -o out.tsv "$@"
    ) </dev/null >got.out 2>got.err
    status=$?
    ok=1
    if [ "$status" -ne "$want_status" ]; then
        echo "FAIL: $name: exit status $status, expected $want_status ($E -o out.tsv $*)"
        ok=0
    fi
    if [ -s got.out ]; then
        echo "FAIL: $name: output on stdout:"
        sed 's/^/    /' got.out
        ok=0
    fi
    printf '%s\n' "$want_err" >want.err
    if ! cmp -s want.err got.err; then
        echo "FAIL: $name: stderr differs (--- expected, +++ got):"
        diff -u want.err got.err | sed '1,2d; s/^/    /'
        ok=0
    fi
    left=$(cd run && ls -A)
    if [ $keep = 1 ]; then
        if [ "$left" != out.tsv ] || [ "$(cat run/out.tsv)" != 'older output' ]; then
            echo "FAIL: $name: the older out.tsv did not survive as it was (now: $left)"
            ok=0
        fi
    elif [ -n "$left" ]; then
        echo "FAIL: $name: left output behind: $left"
        ok=0
    fi
    if [ $ok = 1 ]; then pass; else failed=$((failed + 1)); fi
}

try="try '$E --help'"

# ---------------------------------------------------------------- list values (lib/cli/cli.c, parse_list)
ctx_range="must be in 1..2147483647"
suffix="expected a number with an optional K, M or G suffix"
refuse "--contexts 0" 2 "$E: invalid value '0' for --contexts: $ctx_range" --bench --contexts 0
refuse "--contexts -1" 2 "$E: invalid value '-1' for --contexts: $ctx_range" --bench --contexts -1
refuse "--contexts 2G (past INT32_MAX)" 2 "$E: invalid value '2G' for --contexts: $ctx_range" \
    --bench --contexts 2G
refuse "--contexts overflowing int64" 2 "$E: invalid value '99999999999G' for --contexts: too large" \
    --bench --contexts 99999999999G
refuse "--contexts bad suffix in a list" 2 "$E: invalid value '1X' for --contexts: $suffix" \
    --bench --contexts 32K,1X
refuse "--contexts 1.5K" 2 "$E: invalid value '1.5K' for --contexts: $suffix" --bench --contexts 1.5K
refuse "--contexts ''" 2 "$E: invalid value '' for --contexts: empty list" --bench --contexts ''
refuse "--contexts ," 2 "$E: invalid value ',' for --contexts: empty list" --bench --contexts ,
refuse "--contexts 32K,,64K" 2 "$E: invalid value '32K,,64K' for --contexts: empty entry" --bench --contexts 32K,,64K
refuse "--budgets 0.1, (trailing comma)" 2 "$E: invalid value '0.1,' for --budgets: empty entry" --bench --budgets 0.1,
refuse "--heads 32" 2 "$E: invalid value '32' for --heads: expected Q/KV, KV dividing Q (e.g. 32/8)" --bench --heads 32
refuse "--heads 32/5" 2 "$E: invalid value '32/5' for --heads: expected Q/KV, KV dividing Q (e.g. 32/8)" --bench --heads 32/5
refuse "--head-dim 96" 2 "$E: invalid value '96' for --head-dim: expected 64 or 128" --bench --head-dim 96
refuse "--head-dim 256" 2 "$E: invalid value '256' for --head-dim: must be in 64..128" --bench --head-dim 256
refuse "--mem-fraction 2" 2 "$E: invalid value '2' for --mem-fraction: must be in 0.01..1" --bench --mem-fraction 2
refuse "--blockkey-bits 12" 2 "$E: invalid value '12' for --blockkey-bits: 16, 8 or both" --bench --blockkey-bits 12
refuse "--blockkey-bits 8,8" 2 "$E: invalid value '8,8' for --blockkey-bits: 16, 8 or both" --bench --blockkey-bits 8,8
refuse "--blockkey-bits 16,8,16" 2 "$E: invalid value '16,8,16' for --blockkey-bits: 16, 8 or both" \
    --bench --blockkey-bits 16,8,16
refuse "--blockkey-bits 4" 2 "$E: invalid value '4' for --blockkey-bits: must be in 8..16" --bench --blockkey-bits 4
refuse "--batches ,4 (leading comma)" 2 "$E: invalid value ',4' for --batches: empty entry" --bench --batches ,4
long=$(printf '1K,%.0s' $(seq 200))1K
refuse "--contexts of 601 characters" 2 "$E: invalid value for --contexts: longer than 511 characters" \
    --bench --contexts "$long"
many=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17
refuse "--contexts with 17 entries" 2 "$E: invalid value '$many' for --contexts: at most 16 entries" \
    --bench --contexts $many
keep=1
refuse "--contexts 0, older output kept" 2 "$E: invalid value '0' for --contexts: $ctx_range" \
    --bench --contexts 0
keep=0
refuse "--batches 0" 2 "$E: invalid value '0' for --batches: must be in 1..4096" --bench --batches 0
refuse "--batches 4097 in a list" 2 "$E: invalid value '4097' for --batches: must be in 1..4096" \
    --bench --batches 1,4097
refuse "--batches 5K" 2 "$E: invalid value '5K' for --batches: must be in 1..4096" --bench --batches 5K
refuse "--batches four" 2 "$E: invalid value 'four' for --batches: $suffix" --bench --batches four
refuse "--batches ''" 2 "$E: invalid value '' for --batches: empty list" --bench --batches ''
budget_range="must be in 1e-09..1e+15"
refuse "--budgets 0" 2 "$E: invalid value '0' for --budgets: $budget_range" --bench --budgets 0
refuse "--budgets -0.1" 2 "$E: invalid value '-0.1' for --budgets: $budget_range" --bench --budgets -0.1
refuse "--budgets abc in a list" 2 "$E: invalid value 'abc' for --budgets: not a number" \
    --bench --budgets 0.1,abc
refuse "--budgets nan" 2 "$E: invalid value 'nan' for --budgets: not a number" --bench --budgets nan
refuse "--budgets inf" 2 "$E: invalid value 'inf' for --budgets: not a number" --bench --budgets inf
refuse "--budgets ''" 2 "$E: invalid value '' for --budgets: empty list" --bench --budgets ''
refuse "--methods unknown" 2 \
    "$E: invalid value 'full,sdpa' for --methods: 'sdpa' is not a method (full, quest or mosaic)" \
    --bench --methods full,sdpa
refuse "--methods without a kernel" 2 \
    "$E: invalid value 'kivi' for --methods: 'kivi' has no benchmark kernel (full, quest or mosaic)" \
    --bench --methods kivi
refuse "--methods dense (renamed)" 2 "$E: invalid value 'dense,quest' for --methods: 'dense' is now 'full'" \
    --bench --methods dense,quest
refuse "--methods packed (renamed)" 2 "$E: invalid value 'quest,packed' for --methods: 'packed' is now 'mosaic'" \
    --bench --methods quest,packed
refuse "--methods dense-variant (now an option)" 2 \
    "$E: invalid value 'dense-variant' for --methods: 'dense-variant' is now '--variant'" \
    --bench --methods dense-variant
refuse "--methods ," 2 "$E: invalid value ',' for --methods: empty list" --bench --methods ,

# ---------------------------------------------------------------- single values
# -P: the registry's specs (lib/methods/params.c), then the limits of the benchmark's caches
refuse "-P keep=0" 2 "$E: invalid value '0' for parameter 'keep': must be in (0, 1]" --bench -P keep=0
refuse "-P keep=1.5" 2 "$E: invalid value '1.5' for parameter 'keep': must be in (0, 1]" --bench -P keep=1.5
refuse "-P keep=x" 2 "$E: invalid value 'x' for parameter 'keep': not a number" --bench -P keep=x
refuse "--param keydim=0" 2 "$E: invalid value '0' for parameter 'keydim': must be in (0, 1]" \
    --bench --param keydim=0
refuse "-P keydim=2" 2 "$E: invalid value '2' for parameter 'keydim': must be in (0, 1]" --bench -P keydim=2
refuse "-P segment=0" 2 "$E: invalid value '0' for parameter 'segment': must be in 1..1000000000" \
    --bench -P segment=0
refuse "-P block=0" 2 "$E: invalid value '0' for parameter 'block': must be in 1..1000000" --bench -P block=0
refuse "-P block=8x" 2 "$E: invalid value '8x' for parameter 'block': not an integer" --bench -P block=8x
refuse "-P page=0" 2 "$E: invalid value '0' for parameter 'page': must be in 1..1048576" --bench -P page=0
refuse "-P recent=-1" 2 "$E: invalid value '-1' for parameter 'recent': must be in 0..1000000000" \
    --bench -P recent=-1
refuse "-P sink=1.5" 2 "$E: invalid value '1.5' for parameter 'sink': not an integer" --bench -P sink=1.5
refuse "-P of an unknown parameter" 2 \
    "$E: unknown parameter 'dprime' (parameters: keep, keydim, segment, block, page, sink, recent)" \
    --bench -P dprime=64
refuse "-P budget (swept by --budgets)" 2 \
    "$E: unknown parameter 'budget' (parameters: keep, keydim, segment, block, page, sink, recent)" \
    --bench -P budget=0.1
refuse "-P without '='" 2 "$E: invalid parameter 'keep': expected KEY=VALUE" --bench -P keep
refuse "-P list, the bad entry second" 2 "$E: invalid value '2' for parameter 'keydim': must be in (0, 1]" \
    --bench -P keep=0.5,keydim=2
refuse "-P blank-separated list" 2 "$E: invalid value '-3' for parameter 'page': must be in 1..1048576" \
    --bench -P 'keep=0.5 page=-3'
refuse "-P repeated, the later one bad" 2 "$E: invalid value '0' for parameter 'block': must be in 1..1000000" \
    --bench -P keep=0.5 -P block=0
refuse "-P without its value" 2 "$E: option '-P' needs a value; $try" --bench -P
# the separate flags of the packed caches moved to -P
for old in keep:keep dprime:keydim segment:segment block:block; do
    refuse "--${old%%:*} (renamed)" 2 "$E: option '--${old%%:*}' is now '-P ${old#*:}'; $try" --bench "--${old%%:*}" 8
    refuse "--${old%%:*}=8 (renamed)" 2 "$E: option '--${old%%:*}' is now '-P ${old#*:}'; $try" --bench "--${old%%:*}=8"
done
refuse "--keep without --bench (renamed)" 2 "$E: option '--keep' is now '-P keep'; $try" kv.h5 --keep

# ---------------------------------------------------------------- single values
refuse "--runs 0" 2 "$E: invalid value '0' for --runs: must be in 1..10000" --bench --runs 0
refuse "--runs 10001" 2 "$E: invalid value '10001' for --runs: must be in 1..10000" --bench --runs 10001
refuse "--warmup -1" 2 "$E: invalid value '-1' for --warmup: must be in 0..10000" --bench --warmup -1
refuse "--device tpu" 2 "$E: invalid value 'tpu' for --device: expected auto, cpu or gpu" --bench --device tpu
refuse "--threads 0" 2 "$E: invalid value '0' for --threads: must be in 1..1024" --bench --threads 0

# ---------------------------------------------------------------- what --bench refuses, and options without it
refuse "--bench with an operand" 2 "$E: --bench takes no operand ('kv.h5'); $try" --bench kv.h5
refuse "--bench --device cpu" 2 "$E: --bench runs on the GPU: --device cpu does not apply; $try" \
    --bench --device cpu
refuse "--bench=1" 2 "$E: option '--bench' takes no value; $try" --bench=1
refuse "--contexts without its value" 2 "$E: option '--contexts' needs a value; $try" --bench --contexts
refuse "--bench --budget (for --budgets)" 2 "$E: --budget applies to a dump; --bench takes --budgets; $try" \
    --bench --budget 0.1
for opt in "-r ref.h5" --summary --check-cpu; do
    # shellcheck disable=SC2086 # -r and its value are two words
    refuse "--bench $opt" 2 "$E: -r, --summary and --check-cpu apply to a dump, not to --bench; $try" --bench $opt
done
refuse "-P block=3 (not a power of two)" 2 "$E: parameter 'block' must be 1, 2, 4, 8 or 16 for the benchmark; $try" \
    --bench -P block=3 --contexts 4K --batches 1
refuse "-P block=32" 2 "$E: parameter 'block' must be 1, 2, 4, 8 or 16 for the benchmark; $try" --bench -P block=32
refuse "-P segment=4 shorter than block 8" 2 "$E: parameter 'segment' must be at least 'block'; $try" \
    --bench -P segment=4 --contexts 4K --batches 1
refuse "-P segment=8,block=16" 2 "$E: parameter 'segment' must be at least 'block'; $try" \
    --bench -P segment=8,block=16
need_bench="$E: benchmark options (--contexts, --batches, --budgets, --methods, --variant, -P, --runs, --warmup, --heads, --head-dim, --fp16, --mem-fraction, --blockkey-bits) need --bench; $try"
for opt in "--contexts 32K" "--batches 4" "--budgets 0.1" "--methods full" "--variant" "-P keep=0.5" \
    "--param block=8" "--runs 30" "--warmup 5" "--blockkey-bits 8"; do
    # shellcheck disable=SC2086 # the option and its value are two words
    refuse "$opt without --bench" 2 "$need_bench" $opt
    # shellcheck disable=SC2086
    refuse "$opt without --bench, with a dump" 2 "$need_bench" kv.h5 $opt
done

# ---------------------------------------------------------------- --help writes nothing but the usage
rm -rf run && mkdir run || exit 1
(cd run && exec "$A" --bench -o out.tsv --help) </dev/null >got.out 2>got.err
status=$?
if [ $status -eq 0 ] && [ ! -s got.err ] && grep -q -e '--bench' got.out && [ -z "$(ls -A run)" ]; then
    pass
else
    fail "--bench --help: exit status $status, stderr '$(cat got.err)', left: $(ls -A run)"
fi

# ---------------------------------------------------------------- --bench where it cannot run
version=$("$A" --version) || fail "$E --version"
cuda=$(printf '%s\n' "$version" | sed -n 's/^CUDA: //p')
TINY="--contexts 4K --batches 1 --budgets 0.1 --methods full,quest,mosaic --variant --runs 5 --warmup 2 --blockkey-bits 16,8"
if [ "$cuda" = "no CUDA" ]; then
    no_cuda="$E: --bench: this build has no CUDA"
    refuse "--bench without CUDA" 1 "$no_cuda" --bench
    # shellcheck disable=SC2086
    refuse "--bench without CUDA, tiny run" 1 "$no_cuda" --bench $TINY
    refuse "--bench --device gpu without CUDA" 1 "$no_cuda" --bench --device gpu
    refuse "--bench -v without CUDA" 1 "$no_cuda" --bench -v
    keep=1
    refuse "--bench without CUDA, older output kept" 1 "$no_cuda" --bench --device auto
    keep=0
    echo "SKIP: the benchmark run (${no_cuda#"$E: "})"
    cli_finish
    exit
fi
if [ -z "$cuda" ]; then
    fail "$E --version has no 'CUDA:' line"
fi
# ($TINY: should a GPU stay visible, the run is short)
hide_gpus=1
# shellcheck disable=SC2086
refuse "--bench with every GPU hidden" 1 "$E: --bench: no GPU is visible" --bench $TINY
keep=1
# shellcheck disable=SC2086
refuse "--bench with every GPU hidden, older output kept" 1 "$E: --bench: no GPU is visible" \
    --bench --device gpu $TINY
keep=0
hide_gpus=0

# ---------------------------------------------------------------- the benchmark (needs a usable GPU)
# The run itself decides, as tests/cli_attend_gpu.sh's probe does: the two
# refusals of a CUDA build that finds no GPU 0 it can run on are checked
# exactly and skip the rest.
rm -rf run && mkdir run || exit 1
printf 'older output\n' >run/bench.tsv
# shellcheck disable=SC2086
(cd run && exec "$A" --bench -q $TINY -o bench.tsv) </dev/null >bench.out 2>bench.err
status=$?
if [ $status -ne 0 ]; then
    err=$(cat bench.err)
    case $err in
    "$E: --bench: no GPU is visible" | "$E: --bench: the GPU is not a target of this build")
        if [ $status -eq 1 ] && [ "$(cat run/bench.tsv)" = 'older output' ] && [ "$(cd run && ls -A)" = bench.tsv ]; then
            pass
        else
            fail "refused benchmark: exit status $status (expected 1) or bench.tsv touched: $(cd run && ls -A)"
        fi
        echo "SKIP: the benchmark run (${err#"$E: "})"
        ;;
    *)
        fail "$E --bench $TINY: exit status $status: $err"
        ;;
    esac
    cli_finish
    exit
fi
if [ -s bench.out ] || [ -s bench.err ] || [ "$(cd run && ls -A)" != bench.tsv ]; then
    fail "benchmark with -q -o: stdout '$(cat bench.out)', stderr '$(cat bench.err)', files: $(cd run && ls -A)"
else
    pass
fi

# The columns the man page lists (BENCHMARK), the shape it states, the
# options of $TINY: every expected row once, each consistent in itself.
header="impl	backend	dtype	batch	context	n_heads	n_kv_heads	head_dim	budget	n_sets	runs	median_ms	p10_ms	p90_ms	select_ms	bytes_read	read_tbps	copy_tbps	frac_copy	cache_bytes	peak_mem_bytes	status"
if report=$(awk -F'\t' -v header="$header" -v ctx=4096 -v batch=1 -v budget=0.1 -v runs=5 -v keep_r=32 '
    function isnum(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ }
    function bad(msg) { nbad++; if (nbad <= 12) print "row " NR - 1 " (" $1 " " $2 "): " msg > "/dev/stderr" }
    # read_tbps printed with 4 decimals is bytes / median for a median
    # printed with 5: the bounds of the exact value, widened by both roundings
    function tbps_ok(bytes, m, r) {
        if (m <= 5e-6) return 0
        return r >= bytes / ((m + 5e-6) * 1e9) - 5e-5 - 1e-9 && r <= bytes / ((m - 5e-6) * 1e9) + 5e-5 + 1e-9
    }
    function frac_ok(r, c, f) {
        if (c <= 5e-5) return 0
        return f >= (r - 5e-5) / (c + 5e-5) - 5e-5 - 1e-9 && f <= (r + 5e-5) / (c - 5e-5) + 5e-5 + 1e-9
    }
    NR == 1 {
        if ($0 != header) { print "header is not the documented one: " $0 > "/dev/stderr"; nbad++ }
        for (i = 1; i <= NF; i++) col[$i] = i
        next
    }
    NF != 22 { bad(NF " columns, expected 22"); next }
    {
        impl = $col["impl"]; backend = $col["backend"]
        m = $col["median_ms"]; bytes = $col["bytes_read"]; r = $col["read_tbps"]
        c = $col["copy_tbps"]; f = $col["frac_copy"]; cache = $col["cache_bytes"]
        if (!isnum(c) || c <= 0) bad("copy_tbps " c)
        if (copy == "") copy = c
        else if (c != copy) bad("copy_tbps " c " differs from " copy " in the first row")
    }
    impl == "copy" {
        seen["copy"]++
        if ($col["status"] !~ /^ok/) bad("status " $col["status"])
        if (bytes != 2147483648) bad("bytes_read " bytes ", expected 2 GiB (1 GiB read + written)")
        if (!isnum(m) || m <= 0) bad("median_ms " m)
        if (r != c || f != "1.0000") bad("read_tbps " r " and frac_copy " f " for the copy itself")
        if (!tbps_ok(bytes, m, c)) bad("copy_tbps " c " is not bytes_read / median_ms = " bytes / (m * 1e9))
        if ($col["runs"] != runs) bad("runs " $col["runs"])
        next
    }
    {
        key = impl
        if (impl == "full" && backend != "mkv") key = backend ~ /^mkv-minb[0-9]+$/ ? "full-variant" : "full " backend
        else if (backend != "mkv") key = impl " " backend
        seen[key]++
        if ($col["status"] != "ok") bad("status " $col["status"])
        if ($col["dtype"] != "bf16" || $col["batch"] != batch || $col["context"] != ctx || $col["n_heads"] != 32 ||
            $col["n_kv_heads"] != 8 || $col["head_dim"] != 128 || $col["runs"] != runs)
            bad("configuration " $col["dtype"] " batch " $col["batch"] " context " $col["context"] " heads " \
                $col["n_heads"] "/" $col["n_kv_heads"] " head_dim " $col["head_dim"] " runs " $col["runs"])
        if ($col["budget"] != (impl == "full" ? 1 : budget)) bad("budget " $col["budget"])
        if (!($col["n_sets"] >= 1 && $col["n_sets"] <= 8)) bad("n_sets " $col["n_sets"])
        p10 = $col["p10_ms"]; p90 = $col["p90_ms"]; sel = $col["select_ms"]
        if (!isnum(m) || !isnum(p10) || !isnum(p90) || !(m > 0 && p10 <= m && m <= p90))
            bad("times p10 " p10 ", median " m ", p90 " p90)
        if (impl == "quest" ? !(isnum(sel) && sel > 0 && sel <= m) : sel != "NA")
            bad("select_ms " sel " (median " m ")")
        if (!isnum(bytes) || bytes <= 0) bad("bytes_read " bytes)
        if (!isnum(r) || !tbps_ok(bytes, m, r)) bad("read_tbps " r " is not bytes_read / median_ms = " bytes / (m * 1e9))
        if (!isnum(f) || !frac_ok(r, c, f)) bad("frac_copy " f " is not read_tbps / copy_tbps = " r / c)
        if (!isnum(cache) || !($col["peak_mem_bytes"] >= cache)) bad("peak_mem_bytes " $col["peak_mem_bytes"] " < cache_bytes " cache)
        # K and V of every token in bf16: what dense decode reads
        dense = 2 * 2 * batch * 8 * ctx * 128
        # the fewest tokens a budget attends, and the fewest bytes each of
        # them holds: dense K + V (quest), r kept 16-bit values of K and V (mosaic)
        want_tokens = batch * 8 * budget * ctx
        if (impl == "full" && (bytes != dense || cache != dense))
            bad("bytes_read " bytes ", cache_bytes " cache ", expected K + V = " dense)
        if (impl == "quest" && !(bytes >= want_tokens * 2 * 128 * 2 && bytes < dense && cache > dense))
            bad("bytes_read " bytes " (expected " want_tokens * 512 "..." dense "), cache_bytes " cache " (expected > " dense ")")
        if (impl ~ /^mosaic(-bk8)?$/ && !(bytes >= want_tokens * 2 * keep_r * 2 && bytes < dense))
            bad("bytes_read " bytes " (expected " want_tokens * 4 * keep_r "..." dense ")")
        if (impl ~ /^mosaic/) {
            if (!(cache >= batch * 8 * ctx * 2 * keep_r * 2 && cache < dense))
                bad("cache_bytes " cache " (expected " batch * 8 * ctx * 4 * keep_r "..." dense ")")
            pbytes[impl] = bytes; pcache[impl] = cache
        }
    }
    END {
        split("copy full full-variant quest mosaic mosaic-select mosaic-bk8 mosaic-bk8-select", want, " ")
        for (i = 1; i in want; i++)
            if (seen[want[i]] != 1) { print want[i] ": " seen[want[i]] + 0 " rows, expected 1" > "/dev/stderr"; nbad++ }
        for (k in seen) if (k !~ /^(copy|full|full-variant|quest|mosaic|mosaic-select|mosaic-bk8|mosaic-bk8-select)$/) {
            print "unexpected rows: " k > "/dev/stderr"; nbad++ }
        # 8-bit block keys: each block key of 64 fp16 channels (128 bytes)
        # read as 64 codes and a 4-byte scale, 60 bytes fewer, for every
        # scored block: (4096 - 4 sink - 64 recent) / 8 = 503.5, i.e. 504
        # blocks per KV head; the same number of whole blocks is selected
        for (i = 0; i < 2; i++) {
            a = i ? "mosaic" : "mosaic-select"; b = i ? "mosaic-bk8" : "mosaic-bk8-select"
            if (a in pbytes && b in pbytes && pbytes[a] - pbytes[b] != batch * 8 * 504 * 60) {
                print b " reads " pbytes[b] " bytes, " a " " pbytes[a] ": expected " batch * 8 * 504 * 60 " fewer" > "/dev/stderr"; nbad++ }
        }
        if ("mosaic" in pbytes && "mosaic-select" in pbytes &&
            !(pbytes["mosaic-select"] <= pbytes["mosaic"] && pcache["mosaic-select"] == pcache["mosaic"])) {
            print "mosaic-select reads " pbytes["mosaic-select"] " bytes of cache " pcache["mosaic-select"] \
                ", the whole step " pbytes["mosaic"] " of " pcache["mosaic"] > "/dev/stderr"; nbad++ }
        printf "%d rows checked", NR - 1
        exit nbad > 0
    }' run/bench.tsv 2>&1); then
    pass
    echo "benchmark TSV: $report"
else
    fail "benchmark TSV:"
    printf '%s\n' "$report" | sed 's/^/    /'
    sed 's/^/    | /' run/bench.tsv
fi

# A refusal that comes after the device check: an output that cannot be
# created (the temporary file beside it); it leaves no file.
refuse "-o in a missing directory" 1 "$E: cannot create 'nodir/bench.tsv': No such file or directory" \
    --bench --contexts 4K --batches 1 -o nodir/bench.tsv

# More than the device holds (64M tokens x 8 of this shape need terabytes):
# the case is skipped with its need and, nothing left to run, the run fails
# with the reason (what it may use depends on the free memory), an older
# output kept.
rm -rf run && mkdir run || exit 1
printf 'older output\n' >run/out.tsv
(cd run && exec "$A" --bench -q --contexts 64M --batches 8 --methods full -o out.tsv) </dev/null >got.out 2>got.err
status=$?
want="^$E: benchmark: no case fits the device \\(batch 8 x 67108864 tokens: needs 2304\\.2 GiB of device memory, [0-9.]+ GiB allowed\\)\$"
if [ $status -eq 1 ] && [ ! -s got.out ] && [ "$(wc -l <got.err)" -eq 1 ] && grep -Eq "$want" got.err &&
    [ "$(cd run && ls -A)" = out.tsv ] && [ "$(cat run/out.tsv)" = 'older output' ]; then
    pass
else
    fail "a benchmark larger than the device: exit status $status (expected 1), stderr '$(cat got.err)', files: $(cd run && ls -A)"
fi

cli_finish
