/* Method names and parameters of the attention benchmark (lib/gpu/bench_options.h). */
#include "config.h"
#include "gpu/bench_options.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The methods the benchmark times, by registry name, and the names they had. */
static const struct { const char *name; unsigned bit; } bench_methods[] = {
    {"full", MKV_BENCH_DENSE}, {"quest", MKV_BENCH_QUEST}, {"mosaic", MKV_BENCH_PACKED}};
static const struct { const char *old, *now; } renamed_methods[] = {
    {"dense", "full"}, {"packed", "mosaic"}, {"dense-variant", "--variant"}};

/* The registry parameters the benchmark varies, in the order of -P's help. */
static const struct { const char *method, *name; } bench_params[MKV_BENCH_N_PARAMS] = {
    {"mosaic", "keep"}, {"mosaic", "keydim"}, {"mosaic", "segment"}, {"mosaic", "block"},
    {"quest", "page"},  {"quest", "sink"},    {"quest", "recent"}};

#define COUNT(a) (sizeof (a) / sizeof (a)[0])

int mkv_bench_parse_methods(const char *list, unsigned *bits, mkv_error *err)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *bits = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < COUNT(bench_methods) && strcmp(tok, bench_methods[i].name))
            i++;
        if (i < COUNT(bench_methods)) {
            *bits |= bench_methods[i].bit;
            continue;
        }
        for (size_t j = 0; j < COUNT(renamed_methods); j++)
            if (!strcmp(tok, renamed_methods[j].old))
                return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for --methods: '%s' is now '%s'", list, tok,
                                renamed_methods[j].now);
        return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for --methods: '%s' %s (full, quest or mosaic)", list,
                        tok, mkv_method_find(tok) ? "has no benchmark kernel" : "is not a method");
    }
    if (!*bits)
        return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for --methods: empty list", list);
    return MKV_OK;
}

int mkv_bench_params_init(mkv_bench_params *bp, const mkv_bench_opts *o, mkv_error *err)
{
    const double defaults[MKV_BENCH_N_PARAMS] = {o->keep,  (double)o->dprime / o->head_dim, o->segment, o->block,
                                                 o->page_size, o->sink, o->recent};
    memset(bp, 0, sizeof *bp);
    for (int i = 0; i < MKV_BENCH_N_PARAMS; i++) {
        const mkv_method *m = mkv_method_find(bench_params[i].method);
        const mkv_param_spec *spec = m ? m->params : NULL;
        while (spec && spec->name && strcmp(spec->name, bench_params[i].name))
            spec++;
        if (!spec || !spec->name)
            return mkv_fail(err, MKV_EUNSUP, "method '%s' has no parameter '%s'", bench_params[i].method,
                            bench_params[i].name);
        bp->specs[i] = *spec;
        snprintf(bp->defaults[i], sizeof bp->defaults[i], "%.17g", defaults[i]);
        bp->specs[i].def = bp->defaults[i];
    }
    mkv_params_init(&bp->params, bp->specs);
    return MKV_OK;
}

int mkv_bench_params_apply(const mkv_bench_params *bp, mkv_bench_opts *o, mkv_error *err)
{
    const mkv_params *p = &bp->params;
    o->keep = mkv_params_double(p, "keep");
    o->dprime = (int)ceil(mkv_params_double(p, "keydim") * o->head_dim - 1e-9);
    o->segment = (int)mkv_params_int(p, "segment");
    o->block = (int)mkv_params_int(p, "block");
    o->page_size = (int)mkv_params_int(p, "page");
    o->sink = (int)mkv_params_int(p, "sink");
    o->recent = (int)mkv_params_int(p, "recent");
    /* the packed caches' geometry; mkv_bench_attention checks it again */
    if (o->block > 16 || (o->block & (o->block - 1)))
        return mkv_fail(err, MKV_EUSAGE, "parameter 'block' must be 1, 2, 4, 8 or 16 for the benchmark");
    if (o->segment < o->block)
        return mkv_fail(err, MKV_EUSAGE, "parameter 'segment' must be at least 'block'");
    return MKV_OK;
}
