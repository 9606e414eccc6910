/* A binary heap over a caller-sized array, for the BPE encoders' merge
 * candidates.  MKV_HEAP_DEFINE(name, TYPE, BEFORE) defines
 *     typedef struct { TYPE *items; size_t n; } name;
 *     static void name##_push(name *h, TYPE x);    room for one more item
 *     static TYPE name##_pop(name *h);             h->n > 0
 * where BEFORE(const TYPE *a, const TYPE *b) is true when a pops first. */
#ifndef MKV_HEAP_H
#define MKV_HEAP_H

#include <stddef.h>

#define MKV_HEAP_DEFINE(name, TYPE, BEFORE)                                    \
    typedef struct {                                                           \
        TYPE *items;                                                           \
        size_t n;                                                              \
    } name;                                                                    \
                                                                               \
    static void name##_push(name *h, TYPE x)                                   \
    {                                                                          \
        size_t i = h->n++;                                                     \
        while (i > 0 && BEFORE(&x, &h->items[(i - 1) / 2])) {                  \
            h->items[i] = h->items[(i - 1) / 2];                               \
            i = (i - 1) / 2;                                                   \
        }                                                                      \
        h->items[i] = x;                                                       \
    }                                                                          \
                                                                               \
    static TYPE name##_pop(name *h)                                            \
    {                                                                          \
        TYPE top = h->items[0], last = h->items[--h->n];                       \
        size_t i = 0;                                                          \
        for (;;) {                                                             \
            size_t c = 2 * i + 1;                                              \
            if (c >= h->n)                                                     \
                break;                                                         \
            if (c + 1 < h->n && BEFORE(&h->items[c + 1], &h->items[c]))        \
                c++;                                                           \
            if (!BEFORE(&h->items[c], &last))                                  \
                break;                                                         \
            h->items[i] = h->items[c];                                         \
            i = c;                                                             \
        }                                                                      \
        if (h->n > 0)                                                          \
            h->items[i] = last;                                                \
        return top;                                                            \
    }

#endif
