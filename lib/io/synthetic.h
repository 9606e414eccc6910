/* Seeded synthetic KV dumps whose statistics resemble a real model's
 * (the model is documented in man/mkv-capture.1, "SYNTHETIC MODEL").
 *
 * Per layer and KV head, with d = head_dim, r = rank, positions t = 0..T-1:
 *   pre-RoPE key   k_t = S (rho_t z_t A + mu) + noise_t  [+ beta e_t]
 *   value          v_t = tau_t (rho_t y_t B + noise_t)
 *   key            K_t = RoPE(t) k_t
 * z_t, y_t ~ N(0, I_r); A, B [r x d] with row scales 1/(i+1) (low
 * effective rank); S scales a few low-frequency "outlier" channels, mu
 * gives them a fixed offset; rho_t is a per-region scale shared by every
 * head, tau_t a per-token value scale. Each query picks a few target
 * positions (the sink token 0 and others, half of them recent); a target
 * t gets a salient component beta e_t in its key and the query is the
 * sum of those components rotated to the targets' positions, plus a weak
 * component along the head's main key directions, scaled so that the
 * targets hold attn_mass of the query's softmax.
 *
 * Every random draw comes from a substream keyed by (seed, layer, head,
 * purpose), so a dump is a pure function of the parameters: the same
 * parameters give a byte-identical file. */
#ifndef MKV_SYNTHETIC_H
#define MKV_SYNTHETIC_H

#include <stdint.h>
#include "io/dump.h"

typedef struct {
    /* shape */
    char model[256];          /* model attribute (default "synthetic") */
    int n_layers;             /* default 2 */
    int n_heads;              /* default 8 */
    int n_kv_heads;           /* default 2 */
    int head_dim;             /* default 64; even (RoPE rotates pairs) */
    int64_t n_tokens;         /* T, default 1024 */
    int64_t n_queries;        /* W, default 16; queries at T-W..T-1 */
    uint64_t seed;            /* default 1 */
    double rope_theta;        /* default 10000 */
    mkv_dtype dtype;          /* storage type, default float16 */

    /* statistical model */
    int rank;                 /* latent rank r of keys and values (at most head_dim), default 8 */
    double noise;             /* isotropic noise std per channel, default 0.1 */
    int n_outliers;           /* outlier key channels per head, default 4 (at most head_dim/4) */
    double outlier_scale;     /* outlier channel magnitude factor, default 6 */
    int region_len;           /* mean length of a constant-scale region, default 128 */
    double region_sigma;      /* log-normal sigma of the region scale rho, default 0.3 */
    double value_sigma;       /* log-normal sigma of the per-token value scale tau, default 0.5 */
    int n_targets;            /* targets per query (sink included), default 4 */
    int sink;                 /* 1: token 0 is a target of every query, default 1 */
    int recent_window;        /* "recent" targets lie this close before the query, default 64 */
    double salience;          /* beta = salience * sqrt(head_dim), default 2.5 */
    double query_content;     /* weight of the main-direction component, default 0.1 */
    double attn_mass;         /* softmax mass on the targets, default 0.8 */
} mkv_synthetic_params;

void mkv_synthetic_params_init(mkv_synthetic_params *p);

/* Set one parameter by the name it has in the dump's synthetic_params
 * attribute ("seed", "rank", "noise", "outliers", "outlier_scale",
 * "region_len", "region_sigma", "value_sigma", "targets", "sink",
 * "recent_window", "salience", "query_content", "attn_mass"); value is
 * parsed, ranges are left to mkv_synthetic_check. MKV_EUSAGE on an
 * unknown name or a malformed value. */
int mkv_synthetic_set(mkv_synthetic_params *p, const char *name, const char *value, mkv_error *err);

/* Check every parameter; MKV_EUSAGE with a message naming the parameter. */
int mkv_synthetic_check(const mkv_synthetic_params *p, mkv_error *err);

/* Generate the dump and write it to path ("-" = stdout) atomically
 * (opts may be NULL for the defaults). Memory is O(T * head_dim), one KV
 * head at a time. */
int mkv_synthetic_write(const mkv_synthetic_params *p, const char *path,
                        const mkv_dump_write_opts *opts, mkv_error *err);

/* ---- ground truth, for tests and for checking analyses ---- */

/* The outlier key channels of (layer, kv_head): writes min(n_outliers,
 * head_dim/4) channel indices in increasing order to channels and returns
 * their number (-1 if the parameters are invalid). */
int mkv_synthetic_outliers(const mkv_synthetic_params *p, int layer, int kv_head, int *channels);

/* The target positions of query w (0..W-1, at position T-W+w) of query
 * head q_head in layer: writes them to positions (at most n_targets,
 * distinct, all <= the query's position) and returns their number (-1 if
 * the parameters are invalid or w is out of range). */
int mkv_synthetic_targets(const mkv_synthetic_params *p, int layer, int q_head, int64_t w,
                          int64_t *positions);

#endif
