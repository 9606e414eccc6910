## mosaic: MosaicKV dynamic 2-D compression (included by Makefile.am).
