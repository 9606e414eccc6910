/* GPU attention over compressed dumps, host side: the methods' GPU paths,
 * which answer all queries of one dump head on the GPU, for mkv-attend
 * --device gpu: mosaic and uniform2d (the packed kernel over the GPU
 * layout that mkv_gpu_layout_build of lib/mosaic/packed.h converts loaded
 * heads to, in one place), quest (the Quest-style kernel), full (the
 * dense kernel); one file each in lib/gpu/, listed in lib/gpu/gpu_method.c.
 * Each reports the output, the attended tokens and bytes_read exactly
 * as the method's CPU attend does, so the two devices' tables compare row
 * by row. */
#ifndef MKV_GPU_METHOD_H
#define MKV_GPU_METHOD_H

#include <stddef.h>
#include <stdint.h>

#include "methods/evaluate.h"
#include "methods/method.h"
#include "core/mkv.h"
#include "mkv_cuda.h"
#include "mosaic/mosaic.h"
#include "mosaic/packed.h"

/* Whether method m can run on the GPU for this dump: 1 yes; 0 no, because
 * the build has no CUDA or no usable GPU is visible; -1 no, because the
 * method has no GPU path or the dump's shape is not supported.  why gets
 * the reason. */
int mkv_gpu_method_usable(const mkv_method *m, const mkv_params *p, const mkv_dump_meta *meta, char *why,
                          size_t len);

/* Whether the packed kernels take the selection of mosaic (or uniform2d)
 * parameters p: blocks of 1, 2, 4, 8 or 16 tokens, refine=1.  0 and the
 * reason in why when not. */
int mkv_gpu_mosaic_kernel_takes(const mkv_params *p, char *why, size_t len);

/* Answer every query of (layer, head) with method m's GPU kernel over the
 * arrays of compressed dump c (the scale is 1/sqrt(d)): the evaluation
 * loop's device hook (mkv_eval_device of methods/evaluate.h).  Not
 * thread-safe with respect to other GPU work of the process: callers
 * serialise. */
int mkv_gpu_method_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                          const mkv_eval_queries *q, mkv_eval_answers *a, mkv_error *err);

#endif
