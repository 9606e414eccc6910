/* Tokenizers: text <-> token ids.
 *
 * One structure serves every vocabulary.  A loader builds it in three steps:
 * mkv_tokenizer_new(n), mkv_tokenizer_set_token() for each id, then
 * mkv_tokenizer_finish(), which builds the lookup index, the byte table and
 * each token's decoded bytes.  The algorithm is a set of ops: the scored BPE
 * of llama2.c / sentencepiece is here (mkv_scored_bpe_ops); GPT-2 byte-level
 * BPE lives in its own file and keeps its merge table in `impl`.
 *
 * Decoding is the same for all kinds: each token emits the bytes its ops
 * computed at finish time (control tokens emit nothing), and with
 * strip_space_after_bos the leading space of the token after BOS is dropped,
 * so decode(encode(s, BOS)) == s for a vocabulary with byte fallback.
 */
#ifndef MKV_TOKENIZER_H
#define MKV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

/* Token types; the values are GGUF's tokenizer.ggml.token_type. */
typedef enum {
    MKV_TOKEN_NORMAL = 1,
    MKV_TOKEN_UNKNOWN = 2,
    MKV_TOKEN_CONTROL = 3,      /* BOS, EOS, chat markers: never produced by merges */
    MKV_TOKEN_USER_DEFINED = 4, /* matched whole in the text with MKV_ENCODE_SPECIAL */
    MKV_TOKEN_UNUSED = 5,
    MKV_TOKEN_BYTE = 6          /* byte fallback <0xNN> */
} mkv_token_type;

typedef struct {
    char *text;          /* the piece as the vocabulary spells it */
    uint32_t len;
    char *bytes;         /* what decoding emits (set by mkv_tokenizer_finish) */
    uint32_t n_bytes;
    float score;         /* scored BPE: merge priority, higher first */
    int type;            /* mkv_token_type */
} mkv_token;

/* A growable array of token ids. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} mkv_idbuf;

int mkv_idbuf_push(mkv_idbuf *b, int32_t id, mkv_error *err);

typedef struct mkv_tokenizer mkv_tokenizer;

typedef struct {
    const char *name;
    /* Append the ids of text[0..len) to out.  at_start: the text begins the
     * input (a sentencepiece-style dummy prefix applies only there). */
    int (*encode)(const mkv_tokenizer *t, const char *text, size_t len, int at_start,
                  mkv_idbuf *out, mkv_error *err);
    /* Write the bytes token id decodes to into dst (at most tokens[id].len
     * bytes); return how many. */
    size_t (*piece_bytes)(const mkv_tokenizer *t, int id, char *dst);
    void (*free_impl)(void *impl);
} mkv_tokenizer_ops;

struct mkv_tokenizer {
    const mkv_tokenizer_ops *ops;
    void *impl;                 /* data of the ops (e.g. GPT-2 merges) */
    int vocab_size;
    mkv_token *tokens;          /* [vocab_size] */
    int bos_id, eos_id, unk_id; /* -1 when absent */
    int strip_space_after_bos;  /* decoding drops one leading ' ' after BOS */
    /* scored BPE: how the vocabulary spells a space (" " in llama2.c files,
     * U+2581 in sentencepiece vocabularies) and whether to prepend one */
    char space[8];
    int add_space_prefix;
    int byte_id[256];           /* token of each raw byte, -1 if none */
    int32_t *sorted;            /* lookup index: mergeable pieces by text */
    int n_sorted;
    int32_t *special;           /* control/user-defined ids, longest first */
    int n_special;
    char *decoded;              /* storage of every token's decoded bytes */
};

extern const mkv_tokenizer_ops mkv_scored_bpe_ops;

/* Builder. mkv_tokenizer_new gives a tokenizer of n empty tokens using ops,
 * bos/eos/unk -1, no space prefix. */
int mkv_tokenizer_new(const mkv_tokenizer_ops *ops, int vocab_size, mkv_tokenizer **out,
                      mkv_error *err);
/* Set token id's piece (len bytes, copied), score and type. */
int mkv_tokenizer_set_token(mkv_tokenizer *t, int id, const char *text, size_t len, float score,
                            int type, mkv_error *err);
/* Every token set: build the index, byte table and decoded bytes. */
int mkv_tokenizer_finish(mkv_tokenizer *t, mkv_error *err);
void mkv_tokenizer_free(mkv_tokenizer *t);

/* llama2.c tokenizer.bin: int32 max_token_length, then per token float32
 * score, int32 length, bytes.  vocab_size > 0 must equal the number of
 * entries (the model's vocabulary); 0 accepts any.  Ids 0, 1, 2 are <unk>,
 * BOS, EOS; pieces "<0xNN>" are byte-fallback tokens. */
int mkv_tokenizer_load_llama2c(const char *path, int vocab_size, mkv_tokenizer **out,
                               mkv_error *err);

/* Id of the piece spelled text[0..len) among mergeable pieces, or -1. */
int mkv_tokenizer_lookup(const mkv_tokenizer *t, const char *text, size_t len);

enum {
    MKV_ENCODE_BOS = 1,     /* prepend BOS (error if the vocabulary has none) */
    MKV_ENCODE_EOS = 2,     /* append EOS */
    MKV_ENCODE_SPECIAL = 4  /* control/user-defined pieces in the text become their ids */
};

/* Encode text[0..len) (UTF-8, any bytes allowed) into *ids (malloc'd,
 * caller frees) of *n ids. */
int mkv_tokenizer_encode(const mkv_tokenizer *t, const char *text, size_t len, int flags,
                         int32_t **ids, size_t *n, mkv_error *err);

/* Bytes token id emits when it follows token prev (-1 at the start);
 * NULL for an id outside the vocabulary. */
const char *mkv_tokenizer_piece(const mkv_tokenizer *t, int prev, int id, size_t *len);

/* Decode n ids into *text (malloc'd, NUL-terminated, caller frees) of *len
 * bytes.  An id outside the vocabulary is an MKV_EFORMAT error. */
int mkv_tokenizer_decode(const mkv_tokenizer *t, const int32_t *ids, size_t n, char **text,
                         size_t *len, mkv_error *err);

#endif
