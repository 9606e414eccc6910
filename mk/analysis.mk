## analysis: sources and tests of one work area (included by Makefile.am).
