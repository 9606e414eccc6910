/* The table of `mkv-analyze strategies` (columns in man/mkv-analyze.1):
 * for a compressed dump of method mosaic or uniform2d, one row per layer,
 * KV head, tensor (k, then v) and segment with the strategy the compressor
 * chose, the bytes each of the segment's arrays stores, and the losses it
 * recorded. Heads are read with mkv_mosaic_load (mosaic/packed.h), so that
 * every row has passed the packed format's checks.
 *
 * It lives here rather than in analysis/ (whose tables run over raw dumps
 * and which may not include mosaic/): it is the one table over the packed
 * format's own records. */
#ifndef MKV_CLI_STRATEGIES_H
#define MKV_CLI_STRATEGIES_H

#include "core/mkv.h"

/* Print the table of the compressed dump at path ("-": stdin) to output
 * (a file written whole, never over the input; NULL or "-": stdout, only
 * once the table is complete). Another method: MKV_EFORMAT saying so. */
int mkv_strategies_report(const char *path, const char *output, mkv_error *err);

#endif
