## baselines: Quest, ThinK, KIVI, SnapKV, StreamingLLM, naive 2-D (included by Makefile.am).
