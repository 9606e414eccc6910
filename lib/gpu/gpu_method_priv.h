/* The GPU paths of the compression methods: what each one supports and
 * how it attends, and the helpers the paths share.
 *
 * A method's GPU path is its entry in the table of lib/gpu/gpu_method.c,
 * found by the method's address.  The table lives here and not in
 * struct mkv_method because lib/methods/ and lib/mosaic/ may not include
 * this folder or kernels/ (lib/README): a member of mkv_method pointing to
 * GPU code would make the methods depend on the GPU layer, and the method
 * objects are const, so the GPU layer cannot fill such a member in at run
 * time either.  A method absent from the table has no GPU path. */
#ifndef MKV_GPU_METHOD_PRIV_H
#define MKV_GPU_METHOD_PRIV_H

#include <stddef.h>

#include "gpu/gpu_method.h"

typedef struct {
    const mkv_method *method;   /* the CPU method whose answers the GPU path reproduces */
    /* 1 when the GPU path takes these parameters on this dump; 0 with the
     * reason in why (a phrase: "page=8 (the GPU kernel takes ...)").  Called
     * after the checks every path shares (head_dim, query heads per KV
     * head; see mkv_gpu_shape_supported).  NULL: no further limit. */
    int (*supports)(const mkv_params *p, const mkv_dump_meta *meta, char *why, size_t len);
    /* mkv_gpu_method_attend for this method. */
    int (*attend)(const mkv_params *p, mkv_cdump *c, int layer, int head, const mkv_eval_queries *q,
                  mkv_eval_answers *a, mkv_error *err);
} mkv_gpu_method;

/* The GPU path of m, or NULL when m has none. */
const mkv_gpu_method *mkv_gpu_method_of(const mkv_method *m);

/* The GPU path of each method that has one (lib/gpu/<name>_gpu.c). */
extern const mkv_gpu_method mkv_gpu_full, mkv_gpu_quest, mkv_gpu_mosaic, mkv_gpu_uniform2d;

/* 1 when every GPU kernel takes the dump's head_dim and query heads per
 * KV head, else 0 with the reason in why. */
int mkv_gpu_shape_supported(const mkv_dump_meta *meta, char *why, size_t len);

/* Device buffers of one call, freed together. */
typedef struct {
    void *p[8];
    int n;
} mkv_gpu_devset;

/* A device buffer of bytes recorded in s; NULL with err set. */
void *mkv_gpu_devset_alloc(mkv_gpu_devset *s, size_t bytes, mkv_error *err);
void mkv_gpu_devset_free(mkv_gpu_devset *s);

/* The dense methods' (full, quest) device buffers: the head's K and V in
 * fp16, uploaded, and room for one query's q and out [G][d]. */
typedef struct {
    uint16_t *k, *v;
    float *q, *out;
} mkv_gpu_dense_bufs;

/* Load K and V of (layer, head) from c (arrays "k" and "v", fp16 [T][d])
 * and fill b with buffers recorded in ds. */
int mkv_gpu_dense_setup(mkv_cdump *c, int layer, int head, const mkv_eval_queries *q, mkv_gpu_devset *ds,
                        mkv_gpu_dense_bufs *b, mkv_error *err);

#endif
