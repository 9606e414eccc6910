## compress: compressed dumps, methods, mkv-compress, mkv-attend (included by Makefile.am).
