/* The evaluation's device hook over the GPU drivers (lib/gpu/evaluate_gpu.h). */
#include "config.h"
#include "gpu/evaluate_gpu.h"

#include "gpu/gpu_method.h"

int mkv_gpu_eval_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                        const mkv_eval_queries *q, mkv_eval_answers *a, mkv_error *err)
{
    mkv_gpu_queries gq = {.G = q->G, .d = q->d, .T = q->T, .W = q->W, .q = q->q, .pos = q->pos};
    mkv_gpu_answers ga = {.out = a->out, .attended = a->attended, .bytes_read = a->bytes_read};
    return mkv_gpu_method_attend(m, p, c, layer, head, &gq, &ga, err);
}
