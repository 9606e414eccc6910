#!/usr/bin/env python3
"""The PyTorch peer of mkv-decode's GPU speed runs: transformers' LLaMA of
the Llama-3.1-8B shape (or fewer layers) with random fp16 weights, a static
cache and SDPA attention, decoding batch x 1 tokens per step after a cache
of `context` positions per request.

As with mkv-decode --fill, the context is not prefilled: the static cache's
key and value tensors are filled in place with standard normal values, the
decode then continues at position `context` (the mask lets every step
attend the whole filled cache). Each step is timed between
torch.cuda.synchronize() calls, the first `warmup` left out; median and
p99 in milliseconds, one TSV row per (context, batch) on stdout:

    context batch layers steps step_ms_median step_ms_p99 tokens_s cache_bytes peak_mem_bytes status

    python3 scripts/decode_peer.py --contexts 128K --batches 1,4
    python3 scripts/decode_peer.py --layers 2 --contexts 4K --steps 4   # a quick check
"""
import argparse
import statistics
import sys
import time

from sdpa_peer import quantile, size   # the attention peer's parsing and percentiles


def size_list(text):
    return [size(t) for t in text.split(",")]


def cache_tensors(cache):
    """The static cache's key and value tensors, by either layout transformers uses."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return list(cache.key_cache) + list(cache.value_cache)


def run(torch, transformers, args, context, batch):
    cfg = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5,
        max_position_embeddings=context + args.steps + 1, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        attn_implementation="sdpa")
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    length = context + args.steps + 1
    cache = transformers.StaticCache(config=cfg, max_batch_size=batch, max_cache_len=length, device="cuda",
                                     dtype=torch.float16)
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
    times = []
    with torch.no_grad():
        # one step at position 0 makes the cache's tensors where they are made lazily
        model(input_ids=ids, past_key_values=cache, cache_position=torch.tensor([0], device="cuda"), use_cache=True)
        tensors = cache_tensors(cache)
        for t in tensors:
            t.normal_()
        for s in range(args.steps):
            pos = torch.tensor([context + s], device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
            ids = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - t0))
    cache_bytes = sum(t.numel() * t.element_size() for t in tensors)
    kept = times[args.warmup:]
    med = statistics.median(kept)
    return (med, quantile(kept, 0.99), 1e3 * batch / med, cache_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=size_list, default=size_list("128K"))
    ap.add_argument("--batches", type=size_list, default=[1])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.layers < 1 or args.steps <= args.warmup:
        ap.error("--layers must be positive and --steps more than --warmup")
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"decode_peer.py: {e}")
    if not torch.cuda.is_available():
        sys.exit("decode_peer.py: no CUDA device")
    print("context\tbatch\tlayers\tsteps\tstep_ms_median\tstep_ms_p99\ttokens_s\tcache_bytes\tpeak_mem_bytes\tstatus")
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}",
          file=sys.stderr)
    for context in args.contexts:
        for batch in args.batches:
            torch.cuda.reset_peak_memory_stats()
            try:
                med, p99, tps, cache_bytes = run(torch, transformers, args, context, batch)
                status = "ok"
            except torch.OutOfMemoryError:
                med = p99 = tps = float("nan")
                cache_bytes, status = 0, "out of memory"
            print(f"{context}\t{batch}\t{args.layers}\t{args.steps}\t{med:.2f}\t{p99:.2f}\t{tps:.2f}\t{cache_bytes}\t"
                  f"{torch.cuda.max_memory_allocated()}\t{status}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
