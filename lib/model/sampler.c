/* Greedy and temperature / top-p sampling. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>

#include "model/sampler.h"

struct mkv_prob_index {
    float p;
    int32_t id;
};

void mkv_sampler_init(mkv_sampler *s, float temperature, float top_p, uint64_t seed)
{
    s->temperature = temperature > 0.0f ? temperature : 0.0f;
    s->top_p = top_p > 0.0f && top_p < 1.0f ? top_p : 1.0f;
    /* xorshift needs a non-zero state; mix the seed so nearby seeds differ. */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    s->state = z ? z : 0x2545F4914F6CDD1Dull;
    s->work = NULL;
    s->capacity = 0;
}

void mkv_sampler_free(mkv_sampler *s)
{
    free(s->work);
    s->work = NULL;
    s->capacity = 0;
}

/* Uniform in [0, 1) from the top 24 bits of xorshift64*. */
static float next_uniform(mkv_sampler *s)
{
    uint64_t x = s->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->state = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

int mkv_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Descending probability, ascending id on ties: a total order, so the
 * result does not depend on the qsort implementation. */
static int by_prob_desc(const void *pa, const void *pb)
{
    const struct mkv_prob_index *a = pa, *b = pb;
    if (a->p != b->p)
        return a->p > b->p ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int mkv_sample(mkv_sampler *s, const float *logits, int vocab_size, mkv_error *err)
{
    if (s->temperature == 0.0f || vocab_size == 1)
        return mkv_argmax(logits, vocab_size);
    if (s->capacity < vocab_size) {
        struct mkv_prob_index *w = realloc(s->work, (size_t)vocab_size * sizeof *w);
        if (!w) {
            mkv_fail(err, MKV_ENOMEM, "out of memory for sampling over %d tokens", vocab_size);
            return -1;
        }
        s->work = w;
        s->capacity = vocab_size;
    }
    float max = logits[mkv_argmax(logits, vocab_size)];
    double sum = 0.0;
    for (int i = 0; i < vocab_size; i++) {
        float p = expf((logits[i] - max) / s->temperature);
        s->work[i] = (struct mkv_prob_index){p, i};
        sum += p;
    }
    int n = vocab_size;
    double mass = sum;
    if (s->top_p < 1.0f) {
        qsort(s->work, (size_t)vocab_size, sizeof *s->work, by_prob_desc);
        double cum = 0.0;
        for (n = 0; n < vocab_size;) {
            cum += s->work[n++].p;
            if (cum >= s->top_p * sum)
                break;
        }
        mass = cum;
    }
    double r = (double)next_uniform(s) * mass, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->work[i].p;
        if (r < cum)
            return s->work[i].id;
    }
    return s->work[n - 1].id; /* rounding left r at the top of the range */
}
