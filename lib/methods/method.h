/* Compression methods: MosaicKV and the baselines behind one interface, so
 * mkv-compress and mkv-attend treat them alike and every method is measured
 * with the same metrics over the same dumps.
 *
 * A method compresses one (layer, KV head) at a time into arrays of a
 * compressed dump (lib/io/cdump.h), and later loads them back and answers
 * attention queries: for the G query heads of that KV head at position p it
 * returns the attention output over tokens 0..p as the method sees them
 * (selected tokens, packed or quantized values), the set of tokens it
 * attended, and the bytes it read. Each method lives in one file,
 * lib/methods/<name>.c (mosaic and uniform2d: lib/mosaic/), whose top
 * comment documents its stored arrays. */
#ifndef MKV_METHOD_H
#define MKV_METHOD_H

#include <stdint.h>
#include "io/cdump.h"
#include "core/mkv.h"

/* ---- parameters ---- */
typedef enum { MKV_PARAM_INT, MKV_PARAM_DOUBLE, MKV_PARAM_STRING } mkv_param_kind;

typedef struct {
    const char *name;      /* e.g. "keep" */
    mkv_param_kind kind;
    const char *def;       /* default as text, e.g. "0.25" */
    double min, max;       /* range for numbers (inclusive) */
    const char *choices;   /* space-separated allowed values (strings; integers too), or NULL */
    const char *help;      /* one line, with its unit */
    unsigned flags;        /* MKV_PARAM_ABOVE_MIN, MKV_PARAM_ODD */
} mkv_param_spec;

/* The parser refuses what a method cannot take, so that --list-methods'
 * ranges and the refusals agree: ABOVE_MIN excludes min itself ("(0, 1]"),
 * ODD takes odd integers only. */
#define MKV_PARAM_ABOVE_MIN 1u
#define MKV_PARAM_ODD 2u

/* The values spec takes, as --list-methods and the range errors write
 * them: "0..1", "(0, 1]", "2|4", "1..1000000, odd", "fixed|dynamic|ratio",
 * "text". */
void mkv_param_range_text(const mkv_param_spec *spec, char *buf, size_t size);

#define MKV_MAX_PARAMS 32
typedef struct {
    int n;
    const mkv_param_spec *spec[MKV_MAX_PARAMS];
    char value[MKV_MAX_PARAMS][64];
    unsigned char given[MKV_MAX_PARAMS]; /* set by mkv_params_set, not a default */
} mkv_params;

/* Fill p with the defaults of specs (terminated by name == NULL). */
void mkv_params_init(mkv_params *p, const mkv_param_spec *specs);
/* Set "key=value" (or key, value): unknown key, bad number, out of range or
 * not a choice -> MKV_EUSAGE with a message naming the parameter. A value
 * set counts as given (mkv_params_given) until mkv_params_forget_given. */
int mkv_params_set(mkv_params *p, const char *key, const char *value, mkv_error *err);
int mkv_params_parse(mkv_params *p, const char *assignment, mkv_error *err);
/* A list of assignments separated by commas or blanks ("keep=1,strategy=fixed"
 * or "keep=1 strategy=fixed"): the number set, or -1 with err set. */
int mkv_params_parse_list(mkv_params *p, const char *list, mkv_error *err);
/* Whether key was set rather than left at its default; and forgetting
 * that, for parameters read back from a file (a record, not a request). */
int mkv_params_given(const mkv_params *p, const char *key);
void mkv_params_forget_given(mkv_params *p);
/* The given parameters among keys (a NULL-terminated list), as
 * "k1=v1, k2=v2" in spec order into buf; returns how many. */
int mkv_params_given_text(const mkv_params *p, const char *const *keys, char *buf, size_t size);
int64_t mkv_params_int(const mkv_params *p, const char *key);
double mkv_params_double(const mkv_params *p, const char *key);
const char *mkv_params_str(const mkv_params *p, const char *key);
/* Canonical text "k1=v1 k2=v2 ..." in spec order. */
void mkv_params_format(const mkv_params *p, char *buf, size_t size);

typedef struct mkv_method mkv_method;

/* How a method wants its token budget split over the heads (its
 * head_budget_rule). */
typedef struct {
    double mean, floor_frac;
    int64_t sink, recent;
} mkv_head_budget_rule;
/* The parameters compressed dump c records (every one, in canonical form)
 * for its method m, into p: a record of the run, not values given now, so
 * none counts as given. MKV_EFORMAT naming the dump when one does not
 * parse. */
int mkv_params_recorded(mkv_params *p, const mkv_method *m, const mkv_cdump *c, mkv_error *err);

/* ---- compression input: one (layer, KV head) of a raw dump ---- */
typedef struct {
    int layer, head;
    int64_t T;               /* tokens */
    int d;                   /* head_dim */
    int G;                   /* query heads per KV head */
    const float *k, *v;      /* [T][d] (post-RoPE keys) */
    int64_t W;               /* observation queries (may be 0) */
    const float *q;          /* [G][W][d] queries of this group, NULL when W = 0 */
    const int32_t *query_pos;/* [W] */
    int threads;
    double budget_scale;     /* > 0: this head's token budget as a multiple of the method's
                                `budget`, planned over every head (methods/head_budget.h);
                                0: the method's budget as it is */
} mkv_head_kv;

/* ---- attention ---- */
typedef struct {
    int G, d;
    const float *q;          /* [G][d] */
    int64_t pos;             /* query position: attends to tokens 0..pos */
    double scale;            /* 1/sqrt(d) */
} mkv_attend_query;

typedef struct {
    float *out;              /* [G][d], filled by the method */
    uint8_t *attended;       /* [T] (caller allocated, zeroed): 1 for each token whose
                                key/value took part (any of the G heads) */
    uint64_t bytes_read;     /* bytes of compressed state this step read */
    double *lse;             /* [G] or NULL: per head, the log-sum-exp of the
                                scaled scores of the tokens attended (what a
                                decoder needs to merge in tokens the method
                                does not hold; mkv_osm_from_output) */
} mkv_attend_result;

/* What a method's decode-time growth did so far (one state): segments
 * finalised by a manager and the time that took (wall clock from start to
 * end of each, and the CPU time of the thread that ran them), tokens and
 * bytes of a temporary region, decode steps that had to wait for the
 * manager. */
typedef struct {
    int64_t finalized;
    double finalize_seconds, finalize_seconds_max;
    double manager_cpu_seconds;
    int64_t temp_tokens;
    uint64_t temp_bytes, temp_bytes_peak;
    int64_t steps_waited;
} mkv_decode_counters;

struct mkv_method {
    const char *name;
    const char *summary;                 /* one line for --help */
    const mkv_param_spec *params;        /* NULL-terminated */
    /* Cross-check parameters against the dump shape (budget larger than the
     * context, group size not dividing d', ...). */
    int (*check)(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err);
    int (*compress)(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w, mkv_error *err);
    /* Optional: with these parameters, the mean token budget (a fraction
     * < 1) the compression drivers split over the heads before compressing
     * (methods/head_budget.h; each head's share reaches compress as
     * budget_scale), at least floor_frac each, the method attending its
     * first `sink` and last `recent` tokens always: 1, or 0 for none. */
    int (*head_budget_rule)(const mkv_params *p, mkv_head_budget_rule *rule);
    /* Optional: once every head of a dump of shape m is compressed into w
     * (its bytes per head and in total), warn about a target the
     * parameters set that the result misses. */
    void (*check_result)(const mkv_params *p, const mkv_dump_meta *m, const mkv_cdump_writer *w);
    /* Load the arrays of (layer, head) into a state for attend. */
    int (*load)(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err);
    int (*attend)(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err);
    /* Optional: attend's answer in attend_pieces pieces that several
     * threads can share (a head's attention is otherwise one thread's
     * task).  attend_begin does what the pieces share (the checks and the
     * token selection: r->attended) and returns a job; attend_piece(job,
     * i) for every i < attend_pieces, on any threads, concurrently;
     * attend_end merges them into r in a fixed order and frees the job, so
     * the floats are attend's whatever the threads (r NULL: only frees it,
     * the pieces run or not).  q and r stay in place until attend_end. */
    int attend_pieces;
    int (*attend_begin)(void *state, const mkv_attend_query *q, mkv_attend_result *r, void **job, mkv_error *err);
    void (*attend_piece)(void *job, int piece);
    void (*attend_end)(void *job, mkv_attend_result *r);
    void (*free_state)(void *state);
    /* Decode-time growth (optional). append adds the token at position T
     * of the state (T = the tokens it holds: the compressed context, then
     * each token appended), given as its post-RoPE key k [d] and value v
     * [d], the method's own way (documented in its file); attend then
     * answers queries up to that position. state_bytes: the physical bytes
     * the state holds, counted as compress counts them. Without append a
     * decoder keeps new tokens beside the state (lib/decode/ccache.h). */
    int (*append)(void *state, const float *k, const float *v, mkv_error *err);
    uint64_t (*state_bytes)(const void *state);
    /* Optional, with append: what the growth did so far; and the end of a
     * run (every pending piece of work done and published). */
    void (*decode_counters)(const void *state, mkv_decode_counters *c);
    int (*decode_flush)(void *state, mkv_error *err);
};

/* Registry: every method, NULL-terminated; lookup by name. */
extern const mkv_method *const mkv_methods[];
const mkv_method *mkv_method_find(const char *name);

/* Exact attention in double accumulation (the reference every method is
 * measured against): out [G][d] for q [G][d] over k, v [T][d], tokens 0..pos;
 * probs (optional, [G][pos+1]) receives the softmax weights. */
void mkv_attend_exact(const float *k, const float *v, int d, const mkv_attend_query *q, float *out, double *probs);

#endif
