#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on the decode shapes of the GPU
attention benchmark (kernels/bench.cu), as its peer: one query token per
request, bf16, 32 query heads over 8 KV heads (enable_gqa), head_dim 128,
each SDPA backend separately (cuDNN, flash, memory-efficient, math).

Timing as in kernels/bench.cu: warm-up, then each step between two CUDA
events, the steps queued behind torch.cuda._sleep so host launch gaps stay
out; inputs rotated over enough buffer sets (together >= 4x L2); median.
Writes TSV with the benchmark's columns (impl = sdpa, backend = the SDPA
backend; status says why a backend did not run).

    python3 scripts/sdpa_peer.py -o sdpa.tsv
    python3 scripts/sdpa_peer.py --contexts 128K,256K --batches 4 --runs 50
"""
import argparse
import math
import statistics
import sys

HEADER = ("impl backend dtype batch context n_heads n_kv_heads head_dim budget n_sets runs "
          "median_ms p10_ms p90_ms select_ms bytes_read read_tbps copy_tbps frac_copy "
          "cache_bytes peak_mem_bytes status").split()


def size(text):
    mult = {"k": 1 << 10, "m": 1 << 20}.get(text[-1:].lower(), 1)
    value = int(text[:-1] if mult > 1 else text) * mult
    if value <= 0:
        raise argparse.ArgumentTypeError(f"bad size '{text}'")
    return value


def quantile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(pos)
    f = pos - i
    return v[i] * (1 - f) + v[i + 1] * f if i + 1 < len(v) else v[i]


def timed_steps(torch, step, n_sets, warmup, runs):
    """Median, p10, p90 in ms of `runs` steps, step(i) using set i % n_sets."""
    for i in range(warmup):
        step(i % n_sets)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    torch.cuda._sleep(int(2e6 + 5e4 * runs))   # cycles: the GPU waits while the host queues
    for i, (a, b) in enumerate(events):
        a.record()
        step(i % n_sets)
        b.record()
    torch.cuda.synchronize()
    ms = [a.elapsed_time(b) for a, b in events]
    return statistics.median(ms), quantile(ms, 0.1), quantile(ms, 0.9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", default="-", help="TSV output (default stdout)")
    ap.add_argument("--contexts", default="32K,128K,256K,512K,1M")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--heads", default="32/8", help="query/KV heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backends", default="cudnn,flash,efficient,math")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mem-fraction", type=float, default=0.9)
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args()
    try:
        contexts = [size(x) for x in args.contexts.split(",")]
        batches = [size(x) for x in args.batches.split(",")]
        hq, hkv = (int(x) for x in args.heads.split("/"))
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"sdpa_peer: {e}", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"sdpa_peer: PyTorch not available: {e}", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("sdpa_peer: no CUDA device", file=sys.stderr)
        return 77
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    chosen = [b for b in args.backends.split(",") if b]
    for b in chosen:
        if b not in backends:
            print(f"sdpa_peer: unknown backend '{b}'", file=sys.stderr)
            return 2

    out = sys.stdout if args.output == "-" else open(args.output, "w")
    log = (lambda *a: None) if args.quiet else (lambda *a: print("sdpa_peer:", *a, file=sys.stderr, flush=True))
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    d = args.head_dim
    dt = torch.bfloat16

    # Device-to-device copy of 1 GiB, read + write counted.
    nbytes = 1 << 30
    src = torch.randn(nbytes // 2, device="cuda", dtype=dt)
    dst = torch.empty_like(src)
    bufs = [(src, dst), (dst, src)]
    copy_ms, _, _ = timed_steps(torch, lambda i: bufs[i][1].copy_(bufs[i][0]), 2, args.warmup, args.runs)
    copy_tbps = 2 * nbytes / (copy_ms * 1e-3) / 1e12
    del src, dst, bufs
    log(f"{props.name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
        f"copy {copy_tbps:.3f} TB/s (read + write)")

    def row(**kw):
        r = {k: "NA" for k in HEADER}
        r.update(impl="sdpa", dtype="bf16", n_heads=hq, n_kv_heads=hkv, head_dim=d, budget=1,
                 select_ms="NA", copy_tbps=f"{copy_tbps:.4f}")
        r.update(kw)
        out.write("\t".join(str(r[k]) for k in HEADER) + "\n")
        out.flush()

    out.write("\t".join(HEADER) + "\n")
    row(impl="copy", backend="torch.copy_", batch=0, context=0, n_sets=1, runs=args.runs,
        median_ms=f"{copy_ms:.5f}", p10_ms=f"{copy_ms:.5f}", p90_ms=f"{copy_ms:.5f}", bytes_read=2 * nbytes,
        read_tbps=f"{copy_tbps:.4f}", frac_copy="1.0000", cache_bytes=0, peak_mem_bytes=0,
        status="ok: 1 GiB device-to-device; bytes_read counts read + write")

    scale = 1.0 / math.sqrt(d)
    for ctx in contexts:
        for batch in batches:
            set_bytes = 2 * batch * hkv * ctx * d * 2
            n_sets = max(1, min(8, -(-4 * l2 // set_bytes)))
            free, total = torch.cuda.mem_get_info()
            need = n_sets * set_bytes + (256 << 20)
            base = dict(batch=batch, context=ctx, n_sets=n_sets, runs=args.runs, cache_bytes=set_bytes)
            if need > args.mem_fraction * free:
                for b in chosen:
                    row(backend=b, **base, status=f"skipped: needs {need / 2**30:.1f} GiB, "
                        f"{args.mem_fraction * free / 2**30:.1f} GiB allowed")
                log(f"batch {batch} x {ctx} tokens skipped (memory)")
                continue
            sets = []
            for _ in range(n_sets):
                q = torch.randn(batch, hq, 1, d, device="cuda", dtype=dt)
                k = torch.randn(batch, hkv, ctx, d, device="cuda", dtype=dt)
                v = torch.randn(batch, hkv, ctx, d, device="cuda", dtype=dt)
                sets.append((q, k, v))
            bytes_read = set_bytes + batch * hq * d * 2
            for b in chosen:
                # The math backend expands K and V to every query head and
                # materialises the scores: skip it where that cannot fit.
                if b == "math":
                    extra = 2 * batch * hq * ctx * d * 2 + batch * hq * ctx * 4 * 3
                    free, _ = torch.cuda.mem_get_info()
                    if extra > 0.8 * free:
                        row(backend=b, **base, status=f"skipped: math backend needs ~{extra / 2**30:.1f} GiB more")
                        continue
                try:
                    # Memory as the mkv rows count it: one set's K, V and q,
                    # plus the most allocated at once while the steps ran
                    # (outputs, workspace); not the other sets.
                    torch.cuda.synchronize()
                    held = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    with sdpa_kernel(backends[b]):
                        def step(i):
                            q, k, v = sets[i]
                            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                        med, p10, p90 = timed_steps(torch, step, n_sets, args.warmup, args.runs)
                        during = torch.cuda.max_memory_allocated() - held
                        o = step(0)
                        torch.cuda.synchronize()
                        finite = bool(torch.isfinite(o).all())
                    tbps = bytes_read / (med * 1e-3) / 1e12
                    row(backend=b, **base, median_ms=f"{med:.5f}", p10_ms=f"{p10:.5f}", p90_ms=f"{p90:.5f}",
                        bytes_read=bytes_read, read_tbps=f"{tbps:.4f}", frac_copy=f"{tbps / copy_tbps:.4f}",
                        peak_mem_bytes=set_bytes + batch * hq * d * 2 + during, status="ok" if finite else "error: non-finite outputs")
                    log(f"{b:9s} batch {batch} x {ctx:7d} tokens {med:8.4f} ms {tbps:.3f} TB/s")
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    msg = str(e).splitlines()[0][:200].replace("\t", " ") if str(e) else type(e).__name__
                    row(backend=b, **base, status=f"unsupported: {msg}")
                    log(f"{b:9s} batch {batch} x {ctx:7d} tokens: {msg}")
                    torch.cuda.synchronize()
            del sets
            torch.cuda.empty_cache()
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
