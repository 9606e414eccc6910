/* Method parameters: typed "key=value" settings checked against each
 * method's spec table, kept as canonical text so that the parameters a
 * compressed dump records reproduce the run exactly. */
#include "config.h"
#include "methods/method.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int find(const mkv_params *p, const char *key)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->spec[i]->name, key) == 0)
            return i;
    return -1;
}

/* Shortest %g text that reads back as the same double. */
static void format_double(double v, char *buf, size_t size)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* Integers take an optional K, M or G suffix (x1024), as sizes do on the
 * command line: segment=4K. */
static int parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno == ERANGE)
        return -1;
    int64_t mult = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mult = INT64_C(1) << 10; break;
        case 'm': case 'M': mult = INT64_C(1) << 20; break;
        case 'g': case 'G': mult = INT64_C(1) << 30; break;
        default: return -1;
        }
        if (end[1] != '\0')
            return -1;
    }
    if (v > INT64_MAX / mult || v < INT64_MIN / mult)
        return -1;
    *out = (int64_t)v * mult;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Is word one of the space-separated choices? */
static int is_choice(const char *choices, const char *word)
{
    size_t n = strlen(word);
    for (const char *c = choices; *c;) {
        c += strspn(c, " ");
        size_t len = strcspn(c, " ");
        if (len == n && n > 0 && strncmp(c, word, n) == 0)
            return 1;
        c += len;
    }
    return 0;
}

void mkv_param_range_text(const mkv_param_spec *s, char *buf, size_t size)
{
    if (s->kind == MKV_PARAM_STRING && !s->choices) {
        snprintf(buf, size, "text");
        return;
    }
    if (s->choices) {
        size_t len = 0;
        buf[0] = '\0';
        for (const char *c = s->choices; *c && len < size;) {
            c += strspn(c, " ");
            size_t n = strcspn(c, " ");
            if (n)
                len += (size_t)snprintf(buf + len, size - len, "%s%.*s", len ? "|" : "", (int)n, c);
            c += n;
        }
        return;
    }
    char lo[32], hi[32];
    if (s->kind == MKV_PARAM_INT) {
        snprintf(lo, sizeof lo, "%.0f", s->min);
        snprintf(hi, sizeof hi, "%.0f", s->max);
    } else {
        format_double(s->min, lo, sizeof lo);
        format_double(s->max, hi, sizeof hi);
    }
    if (s->flags & MKV_PARAM_ABOVE_MIN)
        snprintf(buf, size, "(%s, %s]", lo, hi);
    else
        snprintf(buf, size, "%s..%s%s", lo, hi, s->flags & MKV_PARAM_ODD ? ", odd" : "");
}

/* Check value against spec and write its canonical text to canon. */
static int canonical(const mkv_param_spec *s, const char *value, char *canon, size_t size, mkv_error *err)
{
    char range[80];
    if (strlen(value) >= size)
        return mkv_fail(err, MKV_EUSAGE, "invalid value for parameter '%s': longer than %zu characters",
                        s->name, size - 1);
    if (value[0] == '\0' || strpbrk(value, " \t\n="))
        return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': %s", value, s->name,
                        value[0] ? "must not contain spaces or '='" : "empty");
    switch (s->kind) {
    case MKV_PARAM_INT: {
        int64_t v;
        if (parse_int(value, &v))
            return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': not an integer",
                            value, s->name);
        snprintf(canon, size, "%" PRId64, v);
        int above = (s->flags & MKV_PARAM_ABOVE_MIN) ? (double)v > s->min : (double)v >= s->min;
        if (!above || (double)v > s->max || (s->choices && !is_choice(s->choices, canon)) ||
            ((s->flags & MKV_PARAM_ODD) && v % 2 == 0)) {
            mkv_param_range_text(s, range, sizeof range);
            return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': must be %s %s", value,
                            s->name, s->choices ? "one of" : "in", range);
        }
        return MKV_OK;
    }
    case MKV_PARAM_DOUBLE: {
        double v;
        if (parse_double(value, &v))
            return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': not a number",
                            value, s->name);
        int above = (s->flags & MKV_PARAM_ABOVE_MIN) ? v > s->min : v >= s->min;
        if (!above || v > s->max) {
            mkv_param_range_text(s, range, sizeof range);
            return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': must be in %s",
                            value, s->name, range);
        }
        format_double(v, canon, size);
        return MKV_OK;
    }
    case MKV_PARAM_STRING:
        if (s->choices && !is_choice(s->choices, value)) {
            mkv_param_range_text(s, range, sizeof range);
            return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for parameter '%s': must be one of %s",
                            value, s->name, range);
        }
        snprintf(canon, size, "%s", value);
        return MKV_OK;
    }
    return mkv_fail(err, MKV_EUSAGE, "parameter '%s' has an unknown kind", s->name);
}

void mkv_params_init(mkv_params *p, const mkv_param_spec *specs)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; specs && specs[i].name && i < MKV_MAX_PARAMS; i++) {
        p->spec[i] = &specs[i];
        /* a default that does not parse stays as written; check_methods
         * tests that every default is valid */
        if (canonical(&specs[i], specs[i].def ? specs[i].def : "", p->value[i], sizeof p->value[i], NULL))
            snprintf(p->value[i], sizeof p->value[i], "%s", specs[i].def ? specs[i].def : "");
        p->n = i + 1;
    }
}

int mkv_params_set(mkv_params *p, const char *key, const char *value, mkv_error *err)
{
    int i = find(p, key);
    if (i < 0) {
        if (p->n == 0)
            return mkv_fail(err, MKV_EUSAGE, "unknown parameter '%s' (the method takes none)", key);
        char known[512] = "";
        size_t len = 0;
        for (int j = 0; j < p->n && len < sizeof known; j++)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", j ? ", " : "", p->spec[j]->name);
        return mkv_fail(err, MKV_EUSAGE, "unknown parameter '%s' (parameters: %s)", key, known);
    }
    char canon[sizeof p->value[0]];
    int rc = canonical(p->spec[i], value, canon, sizeof canon, err);
    if (rc == MKV_OK) {
        memcpy(p->value[i], canon, sizeof canon);
        p->given[i] = 1;
    }
    return rc;
}

int mkv_params_given(const mkv_params *p, const char *key)
{
    int i = find(p, key);
    return i >= 0 && p->given[i];
}

void mkv_params_forget_given(mkv_params *p) { memset(p->given, 0, sizeof p->given); }

int mkv_params_given_text(const mkv_params *p, const char *const *keys, char *buf, size_t size)
{
    int n = 0;
    size_t len = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; i < p->n; i++) {
        if (!p->given[i])
            continue;
        for (const char *const *k = keys; *k; k++) {
            if (strcmp(*k, p->spec[i]->name) == 0 && len < size) {
                len += (size_t)snprintf(buf + len, size - len, "%s%s=%s", n ? ", " : "", *k, p->value[i]);
                n++;
            }
        }
    }
    return n;
}

int mkv_params_parse(mkv_params *p, const char *assignment, mkv_error *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return mkv_fail(err, MKV_EUSAGE, "invalid parameter '%s': expected KEY=VALUE", assignment);
    char key[64];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof key)
        return mkv_fail(err, MKV_EUSAGE, "unknown parameter '%.*s'", (int)n, assignment);
    memcpy(key, assignment, n);
    key[n] = '\0';
    return mkv_params_set(p, key, eq + 1, err);
}

int mkv_params_parse_list(mkv_params *p, const char *list, mkv_error *err)
{
    int n = 0;
    for (const char *c = list;;) {
        c += strspn(c, ", \t");
        if (*c == '\0')
            break;
        size_t len = strcspn(c, ", \t");
        char one[160];
        if (len >= sizeof one) {
            mkv_fail(err, MKV_EUSAGE, "invalid parameter '%.20s...': longer than %zu characters", c,
                     sizeof one - 1);
            return -1;
        }
        memcpy(one, c, len);
        one[len] = '\0';
        if (mkv_params_parse(p, one, err))
            return -1;
        n++;
        c += len;
    }
    if (n == 0) {
        mkv_fail(err, MKV_EUSAGE, "invalid parameter list '%s': expected KEY=VALUE[,KEY=VALUE...]", list);
        return -1;
    }
    return n;
}

int mkv_params_recorded(mkv_params *p, const mkv_method *m, const mkv_cdump *c, mkv_error *err)
{
    mkv_params_init(p, m->params);
    char *copy = strdup(mkv_cdump_meta_of(c)->params);
    if (!copy)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = MKV_OK;
    for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok && !rc; tok = strtok_r(NULL, " ", &save))
        if (mkv_params_parse(p, tok, err)) {
            mkv_error_prefix(err, "'%s': the recorded parameters of method '%s'", mkv_cdump_path(c), m->name);
            rc = err->code = MKV_EFORMAT;
        }
    free(copy);
    mkv_params_forget_given(p);
    return rc;
}

int64_t mkv_params_int(const mkv_params *p, const char *key)
{
    int i = find(p, key);
    int64_t v = 0;
    if (i >= 0 && parse_int(p->value[i], &v) != 0) {
        double d = 0;
        parse_double(p->value[i], &d);
        v = (int64_t)d;
    }
    return v;
}

double mkv_params_double(const mkv_params *p, const char *key)
{
    int i = find(p, key);
    double v = NAN;
    if (i >= 0)
        parse_double(p->value[i], &v);
    return v;
}

const char *mkv_params_str(const mkv_params *p, const char *key)
{
    int i = find(p, key);
    return i >= 0 ? p->value[i] : NULL;
}

void mkv_params_format(const mkv_params *p, char *buf, size_t size)
{
    size_t len = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; i < p->n && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s=%s", i ? " " : "", p->spec[i]->name, p->value[i]);
}
