/* The GPU as the device of an evaluation (lib/methods/evaluate.h): the
 * per-method GPU drivers of lib/gpu/gpu_method.h behind the device hook. */
#ifndef MKV_EVALUATE_GPU_H
#define MKV_EVALUATE_GPU_H

#include "methods/evaluate.h"

/* An mkv_eval_device: mkv_gpu_method_attend for the queries of one head. */
int mkv_gpu_eval_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                        const mkv_eval_queries *q, mkv_eval_answers *a, mkv_error *err);

#endif
