/* Choosing the next token from logits: greedy, or temperature sampling
 * (optionally nucleus/top-p) with a seeded generator, so the same seed gives
 * the same tokens on every machine. */
#ifndef MKV_SAMPLER_H
#define MKV_SAMPLER_H

#include <stdint.h>
#include "core/mkv.h"

typedef struct {
    float temperature;   /* 0: greedy (argmax) */
    float top_p;         /* nucleus cut-off in (0, 1]; 1 disables */
    uint64_t state;      /* xorshift64* state */
    struct mkv_prob_index *work;  /* top-p working space, grown on demand */
    int capacity;
} mkv_sampler;

/* temperature >= 0 and top_p in (0, 1] (other values are clamped). */
void mkv_sampler_init(mkv_sampler *s, float temperature, float top_p, uint64_t seed);
void mkv_sampler_free(mkv_sampler *s);

/* Index of the largest value, the first one on ties. */
int mkv_argmax(const float *x, int n);

/* Draw a token from logits[0..vocab_size) (not modified).  Returns the
 * token, or -1 with err set when working space cannot be allocated. */
int mkv_sample(mkv_sampler *s, const float *logits, int vocab_size, mkv_error *err);

#endif
