/* The evaluation harness of lib/methods/evaluate.h: setup, the per-head
 * loop over the stored queries, and the row and summary tables. */
#include "config.h"
#include "methods/evaluate.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/tasks.h"
#include "core/tensor.h"
#include "methods/metrics.h"

static int method_names(char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; mkv_methods[i] && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", mkv_methods[i]->name);
    return (int)len;
}

/* The raw dump must be the one the compressed dump was made from. */
static int match_reference(mkv_eval *s, mkv_error *err)
{
    const mkv_dump_meta *r = s->m, *c = &s->cm->raw;
    struct { const char *name; int64_t raw, comp; } f[] = {
        {"n_layers", r->n_layers, c->n_layers}, {"n_heads", r->n_heads, c->n_heads},
        {"n_kv_heads", r->n_kv_heads, c->n_kv_heads}, {"head_dim", r->head_dim, c->head_dim},
        {"n_tokens", r->n_tokens, c->n_tokens}, {"queries", r->n_queries, c->n_queries},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].raw != f[i].comp)
            return mkv_fail(err, MKV_EFORMAT, "'%s' is not the dump '%s' was made from: %s is %" PRId64
                            " there, %" PRId64 " here", mkv_dump_path(s->raw), s->c_label, f[i].name,
                            f[i].raw, f[i].comp);
    int32_t *raw_pos = calloc((size_t)r->n_queries + 1, sizeof *raw_pos);
    if (!raw_pos)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = mkv_dump_read_query_pos(s->raw, raw_pos, err);
    for (int64_t w = 0; !rc && w < r->n_queries; w++)
        if (raw_pos[w] != s->query_pos[w])
            rc = mkv_fail(err, MKV_EFORMAT, "'%s' is not the dump '%s' was made from: query %" PRId64
                          " is at position %d there, %d here", mkv_dump_path(s->raw), s->c_label, w,
                          raw_pos[w], s->query_pos[w]);
    free(raw_pos);
    return rc;
}

int mkv_eval_open(mkv_eval *s, const mkv_eval_inputs *a, mkv_error *err)
{
    memset(s, 0, sizeof *s);
    s->check_cpu = a->check_cpu;
    s->c_label = strcmp(a->compressed, "-") == 0 ? "(stdin)" : a->compressed;
    int rc = mkv_cdump_open(a->compressed, &s->c, err);
    if (rc)
        return rc;
    s->cm = mkv_cdump_meta_of(s->c);
    s->method = mkv_method_find(s->cm->method);
    if (!s->method) {
        char names[512];
        method_names(names, sizeof names);
        return mkv_fail(err, MKV_EFORMAT, "'%s' was made with method '%s', which this build lacks (methods: %s)",
                        s->c_label, s->cm->method, names);
    }
    if ((rc = mkv_params_recorded(&s->params, s->method, s->c, err)))
        return rc;
    if (a->budget) {
        if (!mkv_params_str(&s->params, "budget"))
            return mkv_fail(err, MKV_EUSAGE, "--budget: method '%s' has no token budget", s->method->name);
        if (mkv_params_set(&s->params, "budget", a->budget, err))
            return mkv_error_prefix(err, "--budget: method '%s'", s->method->name);
    }
    if (s->cm->raw.n_queries == 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' has no queries to answer (capture some with --queries N)",
                        s->c_label);
    s->query_pos = calloc((size_t)s->cm->raw.n_queries, sizeof *s->query_pos);
    if (!s->query_pos)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    if ((rc = mkv_cdump_read_query_pos(s->c, s->query_pos, err)))
        return rc;

    s->raw_path = a->reference ? a->reference : s->cm->source;
    if (!a->reference && (!s->raw_path[0] || strcmp(s->raw_path, "-") == 0))
        return mkv_fail(err, MKV_EUSAGE, "'%s' was compressed from standard input: give --reference RAW", s->c_label);
    if (strcmp(s->raw_path, "-") == 0 && strcmp(a->compressed, "-") == 0)
        return mkv_fail(err, MKV_EUSAGE, "COMPRESSED and --reference cannot both be standard input");
    if ((rc = mkv_dump_open(s->raw_path, &s->raw, err))) {
        if (!a->reference) {
            /* say where the name came from and how to give another */
            char msg[MKV_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s (the source recorded in '%s'; give --reference RAW)", err->msg, s->c_label);
            memcpy(err->msg, msg, sizeof msg);
        }
        return rc;
    }
    s->m = mkv_dump_meta_of(s->raw);
    if ((rc = match_reference(s, err)))
        return rc;
    if ((rc = s->method->check(&s->params, s->m, err)))
        return mkv_error_prefix(err, "method '%s'", s->method->name);
    return MKV_OK;
}

void mkv_eval_close(mkv_eval *s)
{
    mkv_cdump_close(s->c);
    mkv_dump_close(s->raw);
    free(s->query_pos);
}

int64_t mkv_eval_n_rows(const mkv_eval *s)
{
    return s->m->n_queries * s->m->n_layers * s->m->n_heads;
}

/* A batch of layers read from the raw dump, and the (layer, KV head) tasks
 * over it the workers share. */
typedef struct {
    const mkv_eval *s;
    int first_layer, n_layers;
    float *k, *v;               /* [n_layers][n_kv_heads][T][d] */
    float *q;                   /* [n_layers][n_heads][W][d] */
    mkv_eval_row *rows;                  /* [W][L][n_heads] for the whole dump */
    pthread_mutex_t mu;         /* the progress count */
    pthread_mutex_t device_mu;  /* one head on the device at a time */
    mkv_progress *progress;
    int64_t *done;
} batch;

/* Answer every query of one (layer, KV head) with the method and exactly. */
static int attend_head(const batch *b, int slot, int h, mkv_error *err)
{
    const mkv_eval *s = b->s;
    const mkv_dump_meta *m = s->m;
    int layer = b->first_layer + slot, d = m->head_dim, G = m->n_heads / m->n_kv_heads;
    int64_t T = m->n_tokens, W = m->n_queries;
    size_t kv_head = (size_t)T * (size_t)d;
    const float *k = b->k + ((size_t)slot * (size_t)m->n_kv_heads + (size_t)h) * kv_head;
    const float *v = b->v + ((size_t)slot * (size_t)m->n_kv_heads + (size_t)h) * kv_head;
    const float *q = b->q + (size_t)slot * (size_t)m->n_heads * (size_t)W * (size_t)d;

    void *state = NULL;
    int rc = s->device && !s->check_cpu ? MKV_OK : s->method->load(&s->params, s->c, layer, h, &state, err);
    if (rc)
        return rc;
    const size_t gd = (size_t)G * (size_t)d;
    float *qbuf = malloc(sizeof(float) * gd);
    float *out = malloc(sizeof(float) * gd);
    float *exact = malloc(sizeof(float) * gd);
    double *probs = malloc(sizeof(double) * (size_t)G * (size_t)T);
    uint8_t *attended = malloc((size_t)T);
    /* GPU: every query of the head at once */
    float *gq = NULL, *gout = NULL, *cout = malloc(sizeof(float) * gd);
    uint8_t *gatt = NULL, *catt = malloc((size_t)T);
    uint64_t *gbytes = NULL;
    int64_t *gpos = NULL;
    if (!qbuf || !out || !exact || !probs || !attended || !cout || !catt)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
    if (!rc && s->device) {
        gq = malloc(sizeof(float) * gd * (size_t)W);
        gout = malloc(sizeof(float) * gd * (size_t)W);
        gatt = calloc((size_t)W * (size_t)T, 1);
        gbytes = calloc((size_t)W, sizeof *gbytes);
        gpos = malloc(sizeof(int64_t) * (size_t)W);
        if (!gq || !gout || !gatt || !gbytes || !gpos)
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        for (int64_t w = 0; w < W && !rc; w++) {
            gpos[w] = s->query_pos[w];
            for (int g = 0; g < G; g++)
                memcpy(gq + (size_t)w * gd + (size_t)g * (size_t)d,
                       q + ((size_t)(h * G + g) * (size_t)W + (size_t)w) * (size_t)d, sizeof(float) * (size_t)d);
        }
        if (!rc) {
            for (size_t i = 0; i < gd * (size_t)W; i++)
                gout[i] = NAN;
            mkv_eval_queries gqs = {.G = G, .d = d, .T = T, .W = W, .q = gq, .pos = gpos};
            mkv_eval_answers ga = {.out = gout, .attended = gatt, .bytes_read = gbytes};
            pthread_mutex_lock((pthread_mutex_t *)&b->device_mu);
            rc = s->device(s->method, &s->params, s->c, layer, h, &gqs, &ga, err);
            pthread_mutex_unlock((pthread_mutex_t *)&b->device_mu);
            if (rc)
                mkv_error_prefix(err, "GPU");
        }
    }
    for (int64_t w = 0; w < W && !rc; w++) {
        int64_t pos = s->query_pos[w], n = pos + 1;
        for (int g = 0; g < G; g++)
            memcpy(qbuf + (size_t)g * (size_t)d, q + ((size_t)(h * G + g) * (size_t)W + (size_t)w) * (size_t)d,
                   sizeof(float) * (size_t)d);
        mkv_attend_query aq = {.G = G, .d = d, .q = qbuf, .pos = pos, .scale = 1.0 / sqrt((double)d)};
        mkv_attend_exact(k, v, d, &aq, exact, probs);
        memset(attended, 0, (size_t)T);
        for (size_t i = 0; i < gd; i++)
            out[i] = NAN;
        mkv_attend_result r = {.out = out, .attended = attended, .bytes_read = 0};
        int64_t cpu_tokens = 0;
        if (s->device) {
            memcpy(out, gout + (size_t)w * gd, sizeof(float) * gd);
            memcpy(attended, gatt + (size_t)w * (size_t)T, (size_t)T);
            r.bytes_read = gbytes[w];
            if (s->check_cpu) {
                memset(catt, 0, (size_t)T);
                mkv_attend_result cr = {.out = cout, .attended = catt, .bytes_read = 0};
                if ((rc = s->method->attend(state, &aq, &cr, err))) {
                    mkv_error_prefix(err, "query %" PRId64 " (position %" PRId64 "), CPU check", w, pos);
                    break;
                }
                for (int64_t t = 0; t < T; t++)
                    cpu_tokens += catt[t] != 0;
            }
        } else if ((rc = s->method->attend(state, &aq, &r, err))) {
            mkv_error_prefix(err, "query %" PRId64 " (position %" PRId64 ")", w, pos);
            break;
        } else if (s->check_cpu) {
            memcpy(cout, out, sizeof(float) * gd);
            for (int64_t t = 0; t < T; t++)
                cpu_tokens += attended[t] != 0;
        }
        int64_t bad = mkv_find_nonfinite(out, (size_t)G * (size_t)d);
        if (bad >= 0) {
            rc = mkv_fail(err, MKV_EFORMAT, "method '%s' gave a non-finite output for query %" PRId64
                          " (position %" PRId64 "), query head %" PRId64 ", channel %" PRId64,
                          s->method->name, w, pos, h * G + bad / d, bad % d);
            break;
        }
        int64_t tokens = 0;
        for (int64_t t = 0; t < T; t++) {
            if (attended[t] && t > pos) {
                rc = mkv_fail(err, MKV_EFORMAT, "method '%s' attended token %" PRId64 " after the position %"
                              PRId64 " of query %" PRId64, s->method->name, t, pos, w);
                break;
            }
            tokens += attended[t] != 0;
        }
        for (int g = 0; g < G && !rc; g++) {
            mkv_eval_row *rw = &b->rows[((size_t)w * (size_t)m->n_layers + (size_t)layer) * (size_t)m->n_heads +
                               (size_t)(h * G + g)];
            rw->rel_l2 = mkv_rel_l2(out + (size_t)g * (size_t)d, exact + (size_t)g * (size_t)d, d);
            rw->recall = mkv_recall(probs + (size_t)g * (size_t)n, attended, n);
            rw->tokens = tokens;
            rw->bytes_read = r.bytes_read;
            rw->cpu_tokens = cpu_tokens;
            rw->cpu_diff = s->check_cpu ? mkv_rel_l2(out + (size_t)g * (size_t)d, cout + (size_t)g * (size_t)d, d) : 0;
        }
    }
    free(qbuf);
    free(out);
    free(exact);
    free(probs);
    free(attended);
    free(gq);
    free(gout);
    free(cout);
    free(catt);
    free(gatt);
    free(gbytes);
    free(gpos);
    if (state)
        s->method->free_state(state);
    return rc;
}

/* Task t of mkv_run_tasks: (layer slot t / n_kv_heads, KV head t % n_kv_heads). */
static int attend_task(void *ctx, int t, mkv_error *err)
{
    batch *b = ctx;
    int n_kv = b->s->m->n_kv_heads;
    int rc = attend_head(b, t / n_kv, t % n_kv, err);
    pthread_mutex_lock(&b->mu);
    mkv_progress_update(b->progress, ++*b->done);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int run_batch(batch *b, int threads, mkv_error *err)
{
    int n_kv = b->s->m->n_kv_heads, t;
    int rc = mkv_run_tasks(b->n_layers * n_kv, threads, attend_task, b, &t, err);
    if (rc != MKV_OK && t >= 0) {
        /* name the head unless the message (from a method's load) does */
        char tag[64];
        snprintf(tag, sizeof tag, "layer %d, KV head %d:", b->first_layer + t / n_kv, t % n_kv);
        if (!strstr(err->msg, tag))
            mkv_error_prefix(err, "layer %d head %d", b->first_layer + t / n_kv, t % n_kv);
    }
    return rc;
}

/* Fill rows [W][L][n_heads] for the whole dump. */
int mkv_eval_run(mkv_eval *s, int threads, mkv_eval_row *rows, mkv_error *err)
{
    const mkv_dump_meta *m = s->m;
    /* enough layers at once to give every thread a (layer, head) */
    int per_batch = (threads + m->n_kv_heads - 1) / m->n_kv_heads;
    if (per_batch > m->n_layers)
        per_batch = m->n_layers;
    size_t kv_layer, q_layer, kv_n, q_n;
    if (mkv_mul_size3((size_t)m->n_kv_heads, (size_t)m->n_tokens, (size_t)m->head_dim, &kv_layer) ||
        mkv_mul_size3((size_t)m->n_heads, (size_t)m->n_queries, (size_t)m->head_dim, &q_layer) ||
        mkv_mul_size(kv_layer, (size_t)per_batch, &kv_n) || mkv_mul_size(q_layer, (size_t)per_batch, &q_n))
        return mkv_fail(err, MKV_ENOMEM, "'%s': a layer is too large to hold in memory", mkv_dump_path(s->raw));
    batch b = {.s = s, .rows = rows};
    int64_t done = 0;
    mkv_progress progress;
    b.progress = &progress;
    b.done = &done;
    b.k = mkv_alloc(kv_n, sizeof(float), "keys", err);
    b.v = mkv_alloc(kv_n, sizeof(float), "values", err);
    b.q = mkv_alloc(q_n, sizeof(float), "queries", err);
    int rc = MKV_OK;
    if (!b.k || !b.v || !b.q)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for %d layers of '%s'", per_batch, mkv_dump_path(s->raw));
    pthread_mutex_init(&b.mu, NULL);
    pthread_mutex_init(&b.device_mu, NULL);
    mkv_progress_start(&progress, "attending", (int64_t)m->n_layers * m->n_kv_heads);
    uint32_t digest = 0;
    for (int l0 = 0; l0 < m->n_layers && !rc; l0 += per_batch) {
        b.first_layer = l0;
        b.n_layers = m->n_layers - l0 < per_batch ? m->n_layers - l0 : per_batch;
        /* all raw reading happens here, never while workers read the compressed dump */
        for (int i = 0; i < b.n_layers && !rc; i++)
            if ((rc = mkv_dump_read_finite(s->raw, l0 + i, 'k', 0, m->n_kv_heads, 0, m->n_tokens,
                                           b.k + i * kv_layer, err)) ||
                (rc = mkv_dump_read_finite(s->raw, l0 + i, 'v', 0, m->n_kv_heads, 0, m->n_tokens,
                                           b.v + i * kv_layer, err)) ||
                (rc = mkv_dump_read_finite(s->raw, l0 + i, 'q', 0, m->n_heads, 0, m->n_queries,
                                           b.q + i * q_layer, err)))
                break;
            else
                digest = mkv_kv_digest_update(mkv_kv_digest_update(digest, b.k + i * kv_layer, kv_layer),
                                              b.v + i * kv_layer, kv_layer);
        if (!rc)
            rc = run_batch(&b, threads, err);
    }
    mkv_progress_finish(&progress);
    /* the K and V attended exactly must be those that were compressed */
    char text[MKV_KV_DIGEST_TEXT];
    mkv_kv_digest_text(digest, text);
    if (!rc && s->cm->source_digest[0] && strcmp(text, s->cm->source_digest) != 0)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s' is not the dump '%s' was made from: its K and V have digest %s, "
                      "the compressed dump records %s", mkv_dump_path(s->raw), s->c_label, text,
                      s->cm->source_digest);
    pthread_mutex_destroy(&b.mu);
    pthread_mutex_destroy(&b.device_mu);
    mkv_free(b.k);
    mkv_free(b.v);
    mkv_free(b.q);
    return rc;
}

/* ------------------------------------------------------------ output */

void mkv_eval_print_rows(FILE *fp, const mkv_eval *s, const mkv_eval_row *rows)
{
    const mkv_dump_meta *m = s->m;
    int G = m->n_heads / m->n_kv_heads;
    fputs(s->check_cpu ? MKV_EVAL_ROW_HEADER MKV_EVAL_CHECK_HEADER "\n" : MKV_EVAL_ROW_HEADER "\n", fp);
    for (int64_t w = 0; w < m->n_queries; w++)
        for (int l = 0; l < m->n_layers; l++)
            for (int h = 0; h < m->n_heads; h++) {
                const mkv_eval_row *r = &rows[((size_t)w * (size_t)m->n_layers + (size_t)l) * (size_t)m->n_heads + (size_t)h];
                fprintf(fp, "%" PRId64 "\t%d\t%d\t%d\t%d\t%.6g\t%.6f\t%" PRId64 "\t%" PRIu64, w,
                        s->query_pos[w], l, h, h / G, r->rel_l2, r->recall, r->tokens, r->bytes_read);
                if (s->check_cpu)
                    fprintf(fp, "\t%" PRId64 "\t%.3g", r->cpu_tokens, r->cpu_diff);
                fputc('\n', fp);
            }
}

int mkv_eval_print_summary(FILE *fp, const mkv_eval *s, const mkv_eval_row *rows, mkv_error *err)
{
    const mkv_dump_meta *m = s->m;
    int64_t n = mkv_eval_n_rows(s);
    double *rel = malloc(sizeof(double) * (size_t)n);
    if (!rel)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    double recall = 0, tokens = 0, bytes = 0, dense = 0;
    for (int64_t i = 0; i < n; i++) {
        rel[i] = rows[i].rel_l2;
        recall += rows[i].recall;
        tokens += (double)rows[i].tokens;
        bytes += (double)rows[i].bytes_read;
        /* a dense float16 cache reads K and V of tokens 0..pos */
        int64_t w = i / ((int64_t)m->n_layers * m->n_heads);
        dense += (double)(s->query_pos[w] + 1) * m->head_dim * 2 * 2;
    }
    mkv_summary st;
    int fail = mkv_summarize(rel, n, &st);
    free(rel);
    if (fail)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    char params[sizeof s->cm->params];
    mkv_params_format(&s->params, params, sizeof params);
    fprintf(fp, MKV_EVAL_SUMMARY_HEADER "\n");
    fprintf(fp, "%s\t%s\t%s\t%.4f\t%" PRIu64 "\t%" PRIu64 "\t%" PRId64 "\t%.6g\t%.6g\t%.6g\t%.6g\t%.6f\t%.2f\t%.1f\t%.1f\n",
            s->method->name, params[0] ? params : "-", s->device_name ? s->device_name : "cpu",
            (double)s->cm->logical_bytes / (double)s->cm->physical_bytes, s->cm->logical_bytes,
            s->cm->physical_bytes, n, st.mean, st.median, st.p90, st.max, recall / (double)n,
            tokens / (double)n, bytes / (double)n, dense / (double)n);
    return MKV_OK;
}
