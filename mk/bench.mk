## bench: the CPU forward-pass benchmark of issue 3 (included by Makefile.am).
## scripts/bench-cpu compiles scripts/bench_forward.c against
## lib/libmosaickv.a with this Makefile's flags, into build-bench/; it is not
## part of `make all` or `make check` (benchmarks are not timed tests).
EXTRA_DIST += scripts/bench-cpu scripts/bench_forward.c
