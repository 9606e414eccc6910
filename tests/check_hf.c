/* Hugging Face model directories and tokenizer.json.
 *
 * References: the llama2.c loader on the same weights (the model and
 * tokenizer tests/model_fixture.py writes, and stories260K when it is
 * there, converted here into HF layout: q/k rows permuted from interleaved
 * pairs to rotate_half order, so equal logits show the layouts agree; the
 * llama2.c tokenizer as tokenizer.json), the published stories260K sample
 * and token ids, tests/model_ref.py (float64 numpy
 * forward with biases and rotate_half RoPE) for a Qwen2-style model and
 * for LLaMA models with "llama3" and "linear" rope_scaling, and
 * token ids worked out by hand for small tokenizer.json files.  Every file
 * is written by this test: safetensors by hand (header JSON + raw data),
 * bf16 by its own rounding.  The published-sample checks are skipped with
 * a message without stories260K in MKV_MODELS_DIR or ../shared/models.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/forward.h"
#include "core/half.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/sampler.h"
#include "testutil.h"
#include "vocab/tokenizer.h"
#include "vocab/tokenizer_json.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581 */

/* ------------------------------------------------------------ environment */


/* ------------------------------------------------------------ files */

/* A path in the run's temporary directory; a few stay valid at once. */
static const char *tmp_path(const char *name)
{
    static char path[8][4400];
    static int which;
    which = (which + 1) % 8;
    snprintf(path[which], sizeof path[which], "%s/%s", test_tmpdir(), name);
    return path[which];
}

/* A fresh directory dir/ (removed with the temporary directory). */
static const char *make_dir(const char *name)
{
    const char *dir = tmp_path(name);
    ck_assert_msg(mkdir(dir, 0755) == 0 || test_file_exists(dir), "mkdir %s", dir);
    return dir;
}

static const char *in_dir(const char *dir, const char *file)
{
    static char path[8][4400];
    static int which;
    which = (which + 1) % 8;
    snprintf(path[which], sizeof path[which], "%s/%s", dir, file);
    return path[which];
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    ck_assert_int_eq(fclose(fp), 0);
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)size, fp), (size_t)size);
    buf[size] = '\0';
    fclose(fp);
    return buf;
}

/* Replace the first occurrence of `from` in file path by `to`. */
static void edit_file(const char *path, const char *from, const char *to)
{
    char *text = read_text(path);
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "'%s' not in %s", from, path);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fwrite(text, 1, (size_t)(at - text), fp);
    fputs(to, fp);
    fputs(at + strlen(from), fp);
    ck_assert_int_eq(fclose(fp), 0);
    free(text);
}

static void json_string(FILE *fp, const char *s, size_t len)
{
    fputc('"', fp);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(fp, "\\%c", c);
        else if (c < 0x20)
            fprintf(fp, "\\u%04x", c);
        else
            fputc(c, fp);
    }
    fputc('"', fp);
}

/* ------------------------------------------------------------ safetensors writer */

typedef struct {
    char name[96];
    const char *dtype; /* "F32", "F16", "BF16", "I8" */
    int ndim;
    int64_t shape[2];
    const float *data; /* numel floats */
} st_entry;

static size_t numel(const st_entry *e)
{
    size_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= (size_t)e->shape[i];
    return n;
}

static size_t elem_size(const char *dtype)
{
    return !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "I8") ? 1 : 2;
}

/* bf16 by round-to-nearest-even of the top 16 bits (weights are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void write_safetensors(const char *path, const st_entry *e, int n)
{
    char *header = NULL;
    size_t hlen = 0;
    FILE *h = open_memstream(&header, &hlen);
    ck_assert_ptr_nonnull(h);
    fprintf(h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = numel(&e[i]) * elem_size(e[i].dtype);
        fprintf(h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++)
            fprintf(h, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        fprintf(h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    fprintf(h, "}");
    fclose(h);
    while (hlen % 8) { /* the format pads the header with spaces */
        char *grown = realloc(header, hlen + 2);
        ck_assert_ptr_nonnull(grown);
        header = grown;
        header[hlen++] = ' ';
    }
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    uint64_t len = hlen;
    fwrite(&len, 8, 1, fp);
    fwrite(header, 1, hlen, fp);
    free(header);
    for (int i = 0; i < n; i++) {
        size_t count = numel(&e[i]);
        for (size_t k = 0; k < count; k++) {
            float f = e[i].data[k];
            if (!strcmp(e[i].dtype, "F32")) {
                fwrite(&f, 4, 1, fp);
            } else if (!strcmp(e[i].dtype, "BF16")) {
                uint16_t b = to_bf16(f);
                fwrite(&b, 2, 1, fp);
            } else if (!strcmp(e[i].dtype, "F16")) {
                uint16_t b = mkv_f32_to_f16(f);
                fwrite(&b, 2, 1, fp);
            } else {
                signed char c = (signed char)(f * 10);
                fwrite(&c, 1, 1, fp);
            }
        }
    }
    ck_assert_int_eq(ferror(fp), 0);
    ck_assert_int_eq(fclose(fp), 0);
}

/* ------------------------------------------------------------ model -> HF tensors */

typedef struct {
    st_entry *e;
    int n;
    float **owned; /* permuted copies */
    int n_owned;
} hf_tensors;

static void add_entry(hf_tensors *t, const char *name, int layer, int ndim, int64_t d0, int64_t d1,
                      const float *data)
{
    st_entry *e = &t->e[t->n++];
    snprintf(e->name, sizeof e->name, name, layer);
    e->dtype = "F32";
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->data = data;
}

/* Rows of w [heads*hd x dim] reordered per head from llama2.c's interleaved
 * pairs (2j, 2j+1) to rotate_half's (j, j + hd/2): even rows first, then odd. */
static float *to_rotate_half(hf_tensors *t, const float *w, int heads, int hd, int dim)
{
    float *out = malloc((size_t)heads * hd * dim * sizeof(float));
    ck_assert_ptr_nonnull(out);
    for (int h = 0; h < heads; h++)
        for (int r = 0; r < hd; r++) {
            int src = r < hd / 2 ? 2 * r : 2 * (r - hd / 2) + 1;
            memcpy(out + ((size_t)h * hd + r) * dim, w + ((size_t)h * hd + src) * dim, (size_t)dim * sizeof(float));
        }
    t->owned[t->n_owned++] = out;
    return out;
}

/* HF tensors of m; permute: m uses interleaved RoPE and must be converted. */
static hf_tensors hf_from_model(const mkv_model *m, int permute)
{
    const mkv_model_config *c = &m->cfg;
    hf_tensors t = {calloc((size_t)(3 + 12 * c->n_layers), sizeof(st_entry)), 0,
                    calloc((size_t)(2 * c->n_layers), sizeof(float *)), 0};
    ck_assert(t.e && t.owned);
    int64_t dim = c->dim, hid = c->hidden_dim, V = c->vocab_size;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    add_entry(&t, "model.embed_tokens.weight", 0, 2, V, dim, m->tok_embedding);
    for (int l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights *w = &m->layers[l];
        const float *wq = permute ? to_rotate_half(&t, w->wq, c->n_heads, c->head_dim, c->dim) : w->wq;
        const float *wk = permute ? to_rotate_half(&t, w->wk, c->n_kv_heads, c->head_dim, c->dim) : w->wk;
        add_entry(&t, "model.layers.%d.input_layernorm.weight", l, 1, dim, 0, w->rms_att);
        add_entry(&t, "model.layers.%d.self_attn.q_proj.weight", l, 2, qd, dim, wq);
        add_entry(&t, "model.layers.%d.self_attn.k_proj.weight", l, 2, kvd, dim, wk);
        add_entry(&t, "model.layers.%d.self_attn.v_proj.weight", l, 2, kvd, dim, w->wv);
        add_entry(&t, "model.layers.%d.self_attn.o_proj.weight", l, 2, dim, qd, w->wo);
        if (c->has_qkv_bias) {
            add_entry(&t, "model.layers.%d.self_attn.q_proj.bias", l, 1, qd, 0, w->bq);
            add_entry(&t, "model.layers.%d.self_attn.k_proj.bias", l, 1, kvd, 0, w->bk);
            add_entry(&t, "model.layers.%d.self_attn.v_proj.bias", l, 1, kvd, 0, w->bv);
        }
        add_entry(&t, "model.layers.%d.post_attention_layernorm.weight", l, 1, dim, 0, w->rms_ffn);
        add_entry(&t, "model.layers.%d.mlp.gate_proj.weight", l, 2, hid, dim, w->w1);
        add_entry(&t, "model.layers.%d.mlp.up_proj.weight", l, 2, hid, dim, w->w3);
        add_entry(&t, "model.layers.%d.mlp.down_proj.weight", l, 2, dim, hid, w->w2);
    }
    add_entry(&t, "model.norm.weight", 0, 1, dim, 0, m->rms_final);
    if (!c->tied_classifier)
        add_entry(&t, "lm_head.weight", 0, 2, V, dim, m->classifier);
    return t;
}

static void hf_tensors_free(hf_tensors *t)
{
    for (int i = 0; i < t->n_owned; i++)
        free(t->owned[i]);
    free(t->owned);
    free(t->e);
}

static st_entry *entry(hf_tensors *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, name))
            return &t->e[i];
    ck_abort_msg("no tensor %s", name);
    return NULL;
}

static void remove_entry(hf_tensors *t, const char *name)
{
    st_entry *e = entry(t, name);
    memmove(e, e + 1, (size_t)(t->e + t->n - e - 1) * sizeof *e);
    t->n--;
}

static void set_dtype(hf_tensors *t, const char *dtype)
{
    for (int i = 0; i < t->n; i++)
        t->e[i].dtype = dtype;
}

/* config.json for c; `extra` (may be "") adds members; a member named in
 * `omit` is left out. */
static void write_config(const char *dir, const mkv_model_config *c, const char *arch, const char *extra,
                         const char *omit)
{
    char members[12][160];
    int n = 0;
#define MEMBER(...) snprintf(members[n++], sizeof members[0], __VA_ARGS__)
    MEMBER("\"hidden_size\": %d", c->dim);
    MEMBER("\"intermediate_size\": %d", c->hidden_dim);
    MEMBER("\"num_hidden_layers\": %d", c->n_layers);
    MEMBER("\"num_attention_heads\": %d", c->n_heads);
    MEMBER("\"num_key_value_heads\": %d", c->n_kv_heads);
    MEMBER("\"max_position_embeddings\": %d", c->max_seq_len);
    MEMBER("\"vocab_size\": %d", c->vocab_size);
    MEMBER("\"rms_norm_eps\": %.9g", (double)c->rms_eps);
    MEMBER("\"rope_theta\": %.1f", c->rope_theta);
    MEMBER("\"tie_word_embeddings\": %s", c->tied_classifier ? "true" : "false");
    if (c->bos_id >= 0)
        MEMBER("\"bos_token_id\": %d", c->bos_id);
    if (c->eos_id >= 0)
        MEMBER("\"eos_token_id\": %d", c->eos_id);
#undef MEMBER
    FILE *fp = fopen(in_dir(dir, "config.json"), "wb");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\n  \"architectures\": [\"%s\"],\n  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"float32\",\n"
                "  \"rope_scaling\": null", arch);
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\"", omit ? omit : "");
        if (!omit || strncmp(members[i], key, strlen(key)) != 0)
            fprintf(fp, ",\n  %s", members[i]);
    }
    if (extra && *extra)
        fprintf(fp, ",\n  %s", extra);
    fprintf(fp, "\n}\n");
    ck_assert_int_eq(fclose(fp), 0);
}

static const char *arch_of(const mkv_model_config *c)
{
    return c->has_qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

/* Weights as one model.safetensors, or as n_shards shards + index. */
static void write_weights(const char *dir, const hf_tensors *t, int n_shards)
{
    if (n_shards <= 1) {
        write_safetensors(in_dir(dir, "model.safetensors"), t->e, t->n);
        return;
    }
    FILE *index = fopen(in_dir(dir, "model.safetensors.index.json"), "wb");
    ck_assert_ptr_nonnull(index);
    fprintf(index, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    int per = (t->n + n_shards - 1) / n_shards;
    for (int s = 0; s < n_shards; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        int first = s * per, count = t->n - first < per ? t->n - first : per;
        write_safetensors(in_dir(dir, name), t->e + first, count);
        for (int i = first; i < first + count; i++)
            fprintf(index, "%s\n  \"%s\": \"%s\"", i ? "," : "", t->e[i].name, name);
    }
    fprintf(index, "}}\n");
    ck_assert_int_eq(fclose(index), 0);
}

/* ------------------------------------------------------------ tokenizer.json writers */

/* Style of the sentencepiece-like file: the legacy Prepend + Replace
 * normalizers, or a Metaspace pre-tokenizer with prepend_scheme "first". */
typedef enum { SPM_LEGACY, SPM_METASPACE } spm_style;

static const char *LEGACY_SECTIONS =
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "{\"type\": \"Prepend\", \"prepend\": \"" SPACE_MARK "\"},"
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SPACE_MARK "\"}]},\n"
    "\"pre_tokenizer\": null,\n";
static const char *METASPACE_SECTIONS =
    "\"normalizer\": null,\n"
    "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" SPACE_MARK "\", "
    "\"prepend_scheme\": \"first\", \"split\": false},\n";
static const char *SPM_TAIL =
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {}},\n"
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \""
    SPACE_MARK "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
    "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n";

/* The pieces of a llama2.c tokenizer (test_tokenizer(which)) in
 * sentencepiece spelling: spaces as U+2581, BOS/EOS as <s>, </s>. */
typedef struct {
    char **piece;
    float *score;
    int n;
} spm_vocab;

static spm_vocab llama2c_vocab(int which)
{
    mkv_tokenizer *t;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_load_llama2c(test_tokenizer(which), test_vocab(which), &t, &err) == MKV_OK, "%s",
                  err.msg);
    spm_vocab v = {calloc((size_t)t->vocab_size, sizeof(char *)), calloc((size_t)t->vocab_size, sizeof(float)),
                   t->vocab_size};
    ck_assert(v.piece && v.score);
    for (int id = 0; id < v.n; id++) {
        const mkv_token *tok = &t->tokens[id];
        char *p = malloc(3 * tok->len + 8);
        size_t at = 0;
        for (uint32_t i = 0; i < tok->len; i++) {
            if (tok->text[i] == ' ') {
                memcpy(p + at, SPACE_MARK, 3);
                at += 3;
            } else {
                p[at++] = tok->text[i];
            }
        }
        p[at] = '\0';
        if (id == 1)
            strcpy(p, "<s>");
        if (id == 2)
            strcpy(p, "</s>");
        v.piece[id] = p;
        v.score[id] = tok->score;
    }
    mkv_tokenizer_free(t);
    return v;
}

static int spm_find(const spm_vocab *v, const char *s, size_t len)
{
    for (int i = 0; i < v->n; i++)
        if (strlen(v->piece[i]) == len && !memcmp(v->piece[i], s, len))
            return i;
    return -1;
}

/* Merges as transformers' SentencePieceExtractor derives them: every split
 * of a piece (at character boundaries) into two pieces of the vocabulary,
 * ordered by the merged piece's score (highest first, stable in id order),
 * within a piece by the ids of the left and right parts. */
static void write_spm_merges(FILE *fp, const spm_vocab *v)
{
    int *order = malloc((size_t)v->n * sizeof *order);
    ck_assert_ptr_nonnull(order);
    for (int i = 0; i < v->n; i++)
        order[i] = i;
    for (int i = 1; i < v->n; i++) /* stable insertion sort by score, descending */
        for (int j = i; j > 0 && v->score[order[j]] > v->score[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int first = 1;
    for (int k = 0; k < v->n; k++) {
        const char *p = v->piece[order[k]];
        size_t len = strlen(p);
        int lefts[64], rights[64], n = 0;
        for (size_t cut = 1; cut < len; cut++) {
            if (((unsigned char)p[cut] & 0xC0) == 0x80)
                continue;
            int l = spm_find(v, p, cut), r = spm_find(v, p + cut, len - cut);
            if (l >= 0 && r >= 0) {
                lefts[n] = l;
                rights[n++] = r;
            }
        }
        for (int i = 1; i < n; i++) /* by (left id, right id) */
            for (int j = i; j > 0 && (lefts[j] < lefts[j - 1] || (lefts[j] == lefts[j - 1] && rights[j] < rights[j - 1])); j--) {
                int a = lefts[j], b = rights[j];
                lefts[j] = lefts[j - 1];
                rights[j] = rights[j - 1];
                lefts[j - 1] = a;
                rights[j - 1] = b;
            }
        for (int i = 0; i < n; i++) {
            fprintf(fp, "%s\n  ", first ? "" : ",");
            first = 0;
            char merge[64];
            snprintf(merge, sizeof merge, "%s %s", v->piece[lefts[i]], v->piece[rights[i]]);
            json_string(fp, merge, strlen(merge));
        }
    }
    free(order);
}

/* tokenizer.json of the llama2.c tokenizer test_tokenizer(which). */
static void write_spm_json(const char *dir, int which, spm_style style)
{
    spm_vocab v = llama2c_vocab(which);
    FILE *fp = fopen(in_dir(dir, "tokenizer.json"), "wb");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n\"added_tokens\": [");
    const char *specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        fprintf(fp, "%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, "
                    "\"rstrip\": false, \"normalized\": false, \"special\": true}", i ? ", " : "", i, specials[i]);
    fprintf(fp, "],\n%s%s", style == SPM_LEGACY ? LEGACY_SECTIONS : METASPACE_SECTIONS, SPM_TAIL);
    fprintf(fp, "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
                "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": true, "
                "\"byte_fallback\": true, \"ignore_merges\": false,\n\"vocab\": {");
    for (int id = 0; id < v.n; id++) {
        fprintf(fp, "%s\n  ", id ? "," : "");
        json_string(fp, v.piece[id], strlen(v.piece[id]));
        fprintf(fp, ": %d", id);
    }
    fprintf(fp, "},\n\"merges\": [");
    write_spm_merges(fp, &v);
    fprintf(fp, "]}}\n");
    ck_assert_int_eq(fclose(fp), 0);
    for (int id = 0; id < v.n; id++)
        free(v.piece[id]);
    free(v.piece);
    free(v.score);
}

static const char *CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}";

static void write_spm_config(const char *dir)
{
    FILE *fp = fopen(in_dir(dir, "tokenizer_config.json"), "wb");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": {\"__type\": \"AddedToken\", "
                "\"content\": \"<s>\", \"special\": true}, \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", "
                "\"chat_template\": ");
    json_string(fp, CHAT_TEMPLATE, strlen(CHAT_TEMPLATE));
    fprintf(fp, "}\n");
    ck_assert_int_eq(fclose(fp), 0);
}

/* GPT-2's byte -> character table, as its encoder.py builds it: printable
 * Latin-1 bytes stand for themselves, the others take U+0100 onwards. */
static unsigned byte_char(int b)
{
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (printable)
        return (unsigned)b;
    unsigned next = 256;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255)))
            next++;
    return next;
}

static void put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A tiny byte-level vocabulary: ids 0..255 are the bytes (id = byte), then
 * merged pieces in merge order, then "xyz" (no merge makes it), then the
 * added tokens.  "G" in a piece below stands for the space character U+0120. */
static const char *const BL_MERGES[] = {"G t", "h e", "Gt he", "G 1", "1 2", "12 3", "! a"};
#define BL_N_MERGES 7
enum { BL_XYZ = 256 + BL_N_MERGES, BL_EOT, BL_IM_START, BL_IM_END, BL_VOCAB };

static void spell(char *out, const char *piece)
{
    out[0] = '\0';
    for (const char *p = piece; *p; p++) {
        char ch[4];
        if (*p == 'G')
            put_utf8(ch, byte_char(' '));
        else
            put_utf8(ch, byte_char((unsigned char)*p));
        strcat(out, ch);
    }
}

/* pre_tokenizer sections of each rule set, as the real files write them. */
static const char *const PRE_GPT2 =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}";
static const char *const PRE_SMOLLM =
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true}, "
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}]}";
#define SPLIT_SECTION(regex)                                                                             \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"" regex \
    "\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": " \
    "false, \"trim_offsets\": true, \"use_regex\": false}]}"
static const char *const PRE_LLAMA3 = SPLIT_SECTION(
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
static const char *const PRE_QWEN2 = SPLIT_SECTION(
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");

/* merges_as_pairs: the newer ["a", "b"] form. */
static void write_byte_level_json(const char *path, const char *pre_section, const char *normalizer,
                                  int merges_as_pairs)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\"version\": \"1.0\", \"added_tokens\": ["
                "{\"id\": %d, \"content\": \"<|endoftext|>\", \"special\": true},"
                "{\"id\": %d, \"content\": \"<|im_start|>\", \"special\": true},"
                "{\"id\": %d, \"content\": \"<|im_end|>\", \"special\": true}],\n",
            BL_EOT, BL_IM_START, BL_IM_END);
    fprintf(fp, "\"normalizer\": %s,\n\"pre_tokenizer\": %s,\n", normalizer, pre_section);
    fprintf(fp, "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                "\"use_regex\": false},\n\"decoder\": {\"type\": \"ByteLevel\"},\n");
    fprintf(fp, "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, "
                "\"byte_fallback\": false, \"vocab\": {");
    char piece[64];
    for (int b = 0; b < 256; b++) {
        put_utf8(piece, byte_char(b));
        fprintf(fp, "%s", b ? ", " : "");
        json_string(fp, piece, strlen(piece));
        fprintf(fp, ": %d", b);
    }
    for (int i = 0; i < BL_N_MERGES; i++) {
        char merged[32];
        snprintf(merged, sizeof merged, "%s", BL_MERGES[i]);
        char *space = strchr(merged, ' ');
        memmove(space, space + 1, strlen(space));
        spell(piece, merged);
        fprintf(fp, ", ");
        json_string(fp, piece, strlen(piece));
        fprintf(fp, ": %d", 256 + i);
    }
    fprintf(fp, ", \"xyz\": %d},\n\"merges\": [", BL_XYZ);
    for (int i = 0; i < BL_N_MERGES; i++) {
        char left[16], right[16], a[64], b[64];
        sscanf(BL_MERGES[i], "%15s %15s", left, right);
        spell(a, left);
        spell(b, right);
        if (merges_as_pairs) {
            fprintf(fp, "%s[", i ? ", " : "");
            json_string(fp, a, strlen(a));
            fprintf(fp, ", ");
            json_string(fp, b, strlen(b));
            fprintf(fp, "]");
        } else {
            char m[130];
            snprintf(m, sizeof m, "%s %s", a, b);
            fprintf(fp, "%s", i ? ", " : "");
            json_string(fp, m, strlen(m));
        }
    }
    fprintf(fp, "]}}\n");
    ck_assert_int_eq(fclose(fp), 0);
}

/* ------------------------------------------------------------ helpers */

static int32_t *encode_flags(const mkv_tokenizer *t, const char *text, int flags, size_t *n)
{
    int32_t *ids;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_encode(t, text, strlen(text), flags, &ids, n, &err) == MKV_OK, "%s", err.msg);
    return ids;
}

static void expect_ids(const mkv_tokenizer *t, const char *text, int flags, const int *want, size_t n_want,
                       const char *what)
{
    size_t n;
    int32_t *ids = encode_flags(t, text, flags, &n);
    char got[512] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", (int)ids[i]);
    ck_assert_msg(n == n_want, "%s '%s': %zu ids (%s), want %zu", what, text, n, got, n_want);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ids[i] == want[i], "%s '%s': ids%s, id %zu should be %d", what, text, got, i, want[i]);
    free(ids);
}

static char *decode(const mkv_tokenizer *t, const int32_t *ids, size_t n)
{
    char *text;
    size_t len;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_decode(t, ids, n, &text, &len, &err) == MKV_OK, "%s", err.msg);
    return text;
}

static float *all_logits(const mkv_model *m, const int32_t *tokens, size_t n)
{
    mkv_forward_opts o = {1, 16, 0};
    mkv_forward *f;
    mkv_error err;
    ck_assert_msg(mkv_forward_create(m, &o, &f, &err) == MKV_OK, "%s", err.msg);
    float *logits = malloc(n * (size_t)m->cfg.vocab_size * sizeof(float));
    ck_assert_ptr_nonnull(logits);
    ck_assert_msg(mkv_forward_run(f, tokens, n, logits, MKV_LOGITS_ALL, &err) == MKV_OK, "%s", err.msg);
    mkv_forward_free(f);
    return logits;
}

/* max |a - b| / max |b| */
static double rel_error(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

static mkv_model *load_llama2c(int which)
{
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_llama2c_load(test_checkpoint(which), &m, &err) == MKV_OK, "%s", err.msg);
    return m;
}

static mkv_tokenizer *load_llama2c_tokenizer(int which)
{
    mkv_tokenizer *t;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_load_llama2c(test_tokenizer(which), test_vocab(which), &t, &err) == MKV_OK, "%s",
                  err.msg);
    return t;
}

/* The directory name of a conversion: "fixture-SUFFIX" or "stories-SUFFIX". */
static const char *dir_name(int which, const char *suffix)
{
    static char name[4][64];
    static int k;
    k = (k + 1) % 4;
    snprintf(name[k], sizeof name[k], "%s-%s", which == TEST_FIXTURE ? "fixture" : "stories", suffix);
    return name[k];
}

/* The llama2.c model test_checkpoint(which) and its tokenizer as an HF
 * directory dir_name(which, suffix) with weights of dtype, in n_shards
 * files. */
static const char *write_llama2c_dir(int which, const char *suffix, const char *dtype, int n_shards)
{
    const char *dir = make_dir(dir_name(which, suffix));
    mkv_model *m = load_llama2c(which);
    mkv_model_config c = m->cfg;
    hf_tensors t = hf_from_model(m, 1);
    set_dtype(&t, dtype);
    write_weights(dir, &t, n_shards);
    c.rope_layout = MKV_ROPE_HALF;
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    write_spm_json(dir, which, SPM_LEGACY);
    write_spm_config(dir);
    hf_tensors_free(&t);
    mkv_model_free(m);
    return dir;
}

static void load_hf(const char *dir, mkv_model **m, mkv_tokenizer **t, mkv_hf_info *info)
{
    mkv_error err;
    ck_assert_msg(mkv_hf_load(dir, m, t, info, &err) == MKV_OK, "%s", err.msg);
}

/* Greedy continuation of prompt; ids of the whole text (prompt included). */
static int32_t *greedy(const mkv_model *m, const int32_t *prompt, size_t n_prompt, size_t n_total)
{
    mkv_forward *f;
    mkv_error err;
    ck_assert_int_eq(mkv_forward_create(m, NULL, &f, &err), MKV_OK);
    int V = m->cfg.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *ids = malloc(n_total * sizeof *ids);
    memcpy(ids, prompt, n_prompt * sizeof *ids);
    ck_assert_int_eq(mkv_forward_run(f, prompt, n_prompt, logits, MKV_LOGITS_LAST, &err), MKV_OK);
    for (size_t i = n_prompt; i < n_total; i++) {
        ids[i] = mkv_argmax(logits, V);
        ck_assert_int_eq(mkv_forward_run(f, &ids[i], 1, logits, MKV_LOGITS_LAST, &err), MKV_OK);
    }
    free(logits);
    mkv_forward_free(f);
    return ids;
}

/* A float16 value, decoded here from its bits (IEEE 754 binary16). */
static float from_f16(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
    double v = exp == 0 ? ldexp(frac, -24) : exp == 31 ? (frac ? NAN : INFINITY) : ldexp(frac | 0x400, exp - 25);
    return (float)(h & 0x8000 ? -v : v);
}

/* Every weight of m as the HF file of dtype holds it ("F32": unchanged). */
static void round_weights(mkv_model *m, const char *dtype)
{
    for (size_t i = 0; i < m->storage_floats; i++) {
        float *w = &m->storage[i];
        if (!strcmp(dtype, "BF16")) {
            uint32_t u = (uint32_t)to_bf16(*w) << 16;
            memcpy(w, &u, 4);
        } else if (!strcmp(dtype, "F16")) {
            *w = from_f16(mkv_f32_to_f16(*w));
        }
    }
}

/* Logits of the HF model in dir against the llama2.c model test_checkpoint(which)
 * over the published text, its weights rounded to `dtype` first; returns
 * the relative error. */
static double logit_error(int which, const char *dir, const char *dtype)
{
    mkv_model *ref = load_llama2c(which), *m;
    round_weights(ref, dtype);
    mkv_tokenizer *t = load_llama2c_tokenizer(which);
    load_hf(dir, &m, NULL, NULL);
    ck_assert_int_eq(m->cfg.rope_layout, MKV_ROPE_HALF);
    ck_assert(m->cfg.tied_classifier && m->classifier == m->tok_embedding);
    size_t n;
    int32_t *ids = encode_flags(t, TEST_PUBLISHED, MKV_ENCODE_BOS, &n);
    float *a = all_logits(m, ids, n), *b = all_logits(ref, ids, n);
    double e = rel_error(a, b, n * (size_t)ref->cfg.vocab_size);
    free(a);
    free(b);
    free(ids);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
    mkv_model_free(ref);
    return e;
}

/* Greedy from "Once upon a time" with the HF model and tokenizer in dir:
 * the llama2.c model's tokens and text, and for stories260K the published
 * sample. */
static void check_greedy(int which, const mkv_model *m, const mkv_tokenizer *t, const char *what)
{
    mkv_model *ref = load_llama2c(which);
    mkv_tokenizer *ref_tok = load_llama2c_tokenizer(which);
    size_t n_prompt, n_pub, n_ref;
    int32_t *prompt = encode_flags(t, "Once upon a time", MKV_ENCODE_BOS, &n_prompt);
    int32_t *ref_prompt = encode_flags(ref_tok, "Once upon a time", MKV_ENCODE_BOS, &n_ref);
    ck_assert_msg(n_prompt == n_ref && !memcmp(prompt, ref_prompt, n_ref * sizeof *prompt),
                  "%s: the prompt's ids differ from the llama2.c tokenizer's", what);
    int32_t *pub = encode_flags(t, TEST_PUBLISHED, MKV_ENCODE_BOS, &n_pub);
    int32_t *gen = greedy(m, prompt, n_prompt, n_pub), *want = greedy(ref, prompt, n_prompt, n_pub);
    for (size_t i = 0; i < n_pub; i++) {
        ck_assert_msg(gen[i] == want[i], "%s token %zu: generated %d, llama2.c %d", what, i, gen[i], want[i]);
        if (which == TEST_STORIES)
            ck_assert_msg(gen[i] == pub[i], "%s token %zu: generated %d, published %d", what, i, gen[i], pub[i]);
    }
    char *text = decode(t, gen, n_pub), *ref_text = decode(ref_tok, want, n_pub);
    ck_assert_str_eq(text, ref_text);
    if (which == TEST_STORIES)
        ck_assert_str_eq(text, TEST_PUBLISHED);
    free(text);
    free(ref_text);
    free(gen);
    free(want);
    free(prompt);
    free(ref_prompt);
    free(pub);
    mkv_tokenizer_free(ref_tok);
    mkv_model_free(ref);
}

/* ------------------------------------------------------------ llama2.c models as HF directories */

/* Loop tests over test_checkpoint(_i): the model tests/model_fixture.py
 * writes, and stories260K. */
START_TEST(test_llama2c_fp32)
{
    const char *dir = write_llama2c_dir(_i, "f32", "F32", 1);
    double e = logit_error(_i, dir, "F32");
    ck_assert_msg(e <= 1e-5, "fp32 HF vs llama2.c logits: relative error %.3g", e);

    /* The whole directory: tokenizer, specials, template, and the llama2.c
     * model's greedy text (for stories260K the published sample)
     * generated from it. */
    mkv_model *m;
    mkv_tokenizer *t;
    mkv_hf_info info;
    load_hf(dir, &m, &t, &info);
    ck_assert_str_eq(info.architecture, "LlamaForCausalLM");
    ck_assert_str_eq(info.dtype, "F32");
    ck_assert_int_eq(info.add_bos, 1);
    ck_assert_ptr_nonnull(info.chat_template);
    ck_assert_str_eq(info.chat_template, CHAT_TEMPLATE);
    ck_assert_str_eq(m->cfg.name, dir_name(_i, "f32"));
    ck_assert_int_eq(t->bos_id, 1);
    ck_assert_int_eq(t->eos_id, 2);
    ck_assert_int_eq(m->cfg.bos_id, 1);
    ck_assert_int_eq(m->cfg.eos_id, 2);
    ck_assert_int_eq(t->vocab_size, test_vocab(_i));
    if (_i == TEST_STORIES) {
        const int want[] = {1, 403, 407, 261, 378};
        expect_ids(t, "Once upon a time", MKV_ENCODE_BOS, want, 5, "tokenizer.json");
    }
    check_greedy(_i, m, t, "F32");
    mkv_hf_info_free(&info);
    ck_assert_ptr_null(info.chat_template);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
}
END_TEST

START_TEST(test_llama2c_sharded)
{
    const char *dir = write_llama2c_dir(_i, "sharded", "F32", 2);
    ck_assert(test_file_exists(in_dir(dir, "model-00002-of-00002.safetensors")));
    ck_assert(!test_file_exists(in_dir(dir, "model.safetensors")));
    double e = logit_error(_i, dir, "F32");
    ck_assert_msg(e <= 1e-5, "sharded HF vs llama2.c logits: relative error %.3g", e);
}
END_TEST

/* bf16 and fp16 round every weight: the logits are those of the llama2.c
 * model with its weights rounded the same way; for stories260K they stay
 * close to the unrounded model's, and greedy decoding from the published
 * prompt gives the published tokens (random weights leave margins too
 * thin for either). */
static void check_16bit(int which, const char *dtype, double tol)
{
    const char *dir = write_llama2c_dir(which, dtype, dtype, 1);
    double e = logit_error(which, dir, dtype);
    ck_assert_msg(e <= 1e-5, "%s HF vs rounded llama2.c logits: relative error %.3g", dtype, e);
    if (which == TEST_STORIES) {
        e = logit_error(which, dir, "F32");
        ck_assert_msg(e <= tol, "%s HF vs llama2.c logits: relative error %.3g > %.3g", dtype, e, tol);
    }
    mkv_model *m;
    mkv_tokenizer *t;
    mkv_hf_info info;
    load_hf(dir, &m, &t, &info);
    ck_assert_str_eq(info.dtype, dtype);
    if (which == TEST_STORIES)
        check_greedy(which, m, t, dtype);
    mkv_hf_info_free(&info);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
}

START_TEST(test_llama2c_bf16) { check_16bit(_i, "BF16", 3e-2); }
END_TEST

START_TEST(test_llama2c_fp16) { check_16bit(_i, "F16", 5e-3); }
END_TEST


/* tokenizer.json converted from a llama2.c tokenizer (tests/model_fixture.py's,
 * tok512.bin) tokenizes as that tokenizer does (itself checked against
 * model_ref.py by check_model), and round-trips. */
START_TEST(test_spm_json_matches_llama2c)
{
    const char *dir = make_dir(dir_name(_i, "legacy"));
    write_spm_json(dir, _i, SPM_LEGACY);
    mkv_tokenizer *ref = load_llama2c_tokenizer(_i), *t;
    mkv_tokenizer_json_info info;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_json_load(in_dir(dir, "tokenizer.json"), NULL, 0, &t, &info, &err) == MKV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(info.add_bos, 1); /* from the post-processor's template */
    ck_assert_ptr_null(info.chat_template);
    ck_assert_int_eq(t->bos_id, 1);
    ck_assert_int_eq(t->eos_id, 2);
    ck_assert_int_eq(t->unk_id, 0);
    size_t n_texts;
    const char *const *texts = test_texts(&n_texts);
    for (size_t k = 0; k < n_texts; k++) {
        size_t n_ref, n;
        int32_t *want = encode_flags(ref, texts[k], MKV_ENCODE_BOS, &n_ref);
        expect_ids(t, texts[k], MKV_ENCODE_BOS, want, n_ref, "legacy tokenizer.json");
        int32_t *ids = encode_flags(t, texts[k], MKV_ENCODE_BOS, &n);
        char *text = decode(t, ids, n);
        ck_assert_msg(!strcmp(text, texts[k]), "string %zu: decoded '%s'", k, text);
        free(text);
        free(ids);
        free(want);
    }
    /* Special pieces in the text, with MKV_ENCODE_SPECIAL: the legacy
     * Prepend normalizer gives each segment its own U+2581 prefix. */
    size_t n_ab, n;
    int32_t *ab = encode_flags(ref, "ab", MKV_ENCODE_BOS, &n_ab);
    int32_t *ids = encode_flags(t, "ab</s>ab", MKV_ENCODE_BOS | MKV_ENCODE_SPECIAL, &n);
    ck_assert_uint_eq(n, 2 * n_ab);
    ck_assert_int_eq(ids[n_ab], 2);
    ck_assert(!memcmp(ids + 1, ab + 1, (n_ab - 1) * sizeof *ids) && !memcmp(ids + n_ab + 1, ab + 1, (n_ab - 1) * sizeof *ids));
    free(ids);
    free(ab);
    mkv_tokenizer_free(t);

    /* Metaspace "first": no prefix for text that starts with a space, so
     * " leading" encodes as the llama2.c tokenizer encodes "leading". */
    const char *meta = make_dir(dir_name(_i, "metaspace"));
    write_spm_json(meta, _i, SPM_METASPACE);
    ck_assert_msg(mkv_tokenizer_json_load(in_dir(meta, "tokenizer.json"), NULL, 0, &t, NULL, &err) == MKV_OK,
                  "%s", err.msg);
    size_t n_ref;
    int32_t *want = encode_flags(ref, "Once upon a time", MKV_ENCODE_BOS, &n_ref);
    expect_ids(t, "Once upon a time", MKV_ENCODE_BOS, want, n_ref, "metaspace");
    free(want);
    if (_i == TEST_STORIES) {
        const int once[] = {1, 403, 407, 261, 378};
        expect_ids(t, "Once upon a time", MKV_ENCODE_BOS, once, 5, "metaspace");
    }
    want = encode_flags(ref, "leading and trailing spaces  ", MKV_ENCODE_BOS, &n_ref);
    expect_ids(t, " leading and trailing spaces  ", MKV_ENCODE_BOS, want, n_ref, "metaspace");
    free(want);
    /* ... and none for a segment after a special token (the legacy file
     * prefixes every segment). */
    ids = encode_flags(t, "</s>ab", MKV_ENCODE_SPECIAL, &n);
    ck_assert_int_eq(ids[0], 2);
    char *text = decode(t, ids, n);
    ck_assert_str_eq(text, "ab");
    free(text);
    free(ids);
    mkv_tokenizer_free(t);
    ck_assert_msg(mkv_tokenizer_json_load(in_dir(dir, "tokenizer.json"), NULL, 0, &t, NULL, &err) == MKV_OK,
                  "%s", err.msg);
    ids = encode_flags(t, "</s>ab", MKV_ENCODE_SPECIAL, &n);
    text = decode(t, ids, n);
    ck_assert_str_eq(text, " ab");
    free(text);
    free(ids);
    mkv_tokenizer_free(t);
    mkv_tokenizer_free(ref);
}
END_TEST

/* ------------------------------------------------------------ hand-worked tokenizers */

/* Sentencepiece-style vocabulary whose merge ranks disagree with "longest
 * or leftmost first", a piece no merge produces, a piece across a space,
 * byte fallback for é only, and an unknown token for the rest.  `sections`
 * gives the normalizer and pre_tokenizer members. */
static const char *const SMALL_LEGACY =
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"" SPACE_MARK "\"},"
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SPACE_MARK "\"}]}, \"pre_tokenizer\": null";
static const char *const SMALL_SPLIT =
    "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" SPACE_MARK "\", "
    "\"prepend_scheme\": \"always\", \"split\": true}";

static void write_small_spm(const char *path, const char *sections)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
        "{\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
        "%s, \"post_processor\": null, \"decoder\": null,"
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
        "\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"" SPACE_MARK "\": 5,"
        "\"a\": 6, \"b\": 7, \"c\": 8, \"ab\": 9, \"bc\": 10, \"abc\": 11, \"ca\": 12, \"" SPACE_MARK "abc\": 13,"
        "\"" SPACE_MARK "a\": 14, \"aa\": 15, \"a" SPACE_MARK "\": 16},"
        "\"merges\": [\"b c\", \"a b\", [\"a\", \"bc\"], \"" SPACE_MARK " abc\", \"" SPACE_MARK " a\", \"a a\", "
        "\"a " SPACE_MARK "\"]}}\n", sections);
    ck_assert_int_eq(fclose(fp), 0);
}

START_TEST(test_spm_rank_merges_by_hand)
{
    const char *path = tmp_path("small-spm.json");
    write_small_spm(path, SMALL_LEGACY);
    mkv_tokenizer *t;
    mkv_tokenizer_json_info info;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_json_load(path, NULL, 0, &t, &info, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(info.add_bos, 0); /* no template, no tokenizer_config */
    ck_assert_int_eq(t->bos_id, 1);
    struct {
        const char *text;
        int want[6];
        size_t n;
    } cases[] = {
        /* ▁ a b c: "b c" (rank 0), then "a bc" (2), then "▁ abc" (3) */
        {"abc", {13}, 1},
        /* "ca" is a piece but "c a" is no merge */
        {"ca", {5, 8, 6}, 3},
        /* "a b" (rank 1) before "▁ a" (rank 4); "▁ ab" is no merge */
        {"ab", {5, 9}, 2},
        /* ▁ a ▁ b: only "▁ a" applies */
        {"a b", {14, 5, 7}, 3},
        /* ▁ b a a a: "a a" at 2 and 3 tie; the leftmost merges */
        {"baaa", {5, 7, 15, 6}, 4},
        /* ▁ b a ▁ b: "a ▁" merges across the space (no word splitting) */
        {"ba b", {5, 7, 16, 7}, 4},
        /* é by byte fallback; d has no byte token: <unk>, fused with the next */
        {"\xc3\xa9", {5, 3, 4}, 3},
        {"dd", {5, 0}, 2},
        {"", {0}, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        expect_ids(t, cases[k].text, 0, cases[k].want, cases[k].n, "small spm");
    int32_t ids[] = {1, 13, 5, 3, 4, 2};
    char *text = decode(t, ids, 6);
    ck_assert_str_eq(text, "abc \xc3\xa9");
    free(text);
    mkv_tokenizer_free(t);

    /* Metaspace with split: every U+2581 starts a word, so "a ▁" cannot
     * merge; prepend_scheme "always" prefixes every segment but one that
     * starts with a space. */
    const char *split = tmp_path("small-spm-split.json");
    write_small_spm(split, SMALL_SPLIT);
    ck_assert_msg(mkv_tokenizer_json_load(split, NULL, 0, &t, NULL, &err) == MKV_OK, "%s", err.msg);
    const int ba_b[] = {5, 7, 6, 5, 7}, ab_ab[] = {5, 9, 2, 5, 9}, sp_ab[] = {5, 9};
    expect_ids(t, "ba b", 0, ba_b, 5, "split spm");
    expect_ids(t, "ab</s>ab", MKV_ENCODE_SPECIAL, ab_ab, 5, "split spm");
    expect_ids(t, " ab", 0, sp_ab, 2, "split spm");
    mkv_tokenizer_free(t);

    /* Padded to a model vocabulary of 20: ids 17..19 decode to nothing. */
    ck_assert_msg(mkv_tokenizer_json_load(path, NULL, 20, &t, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(t->vocab_size, 20);
    int32_t pad[] = {6, 19, 7};
    text = decode(t, pad, 3);
    ck_assert_str_eq(text, "ab");
    free(text);
    mkv_tokenizer_free(t);
    /* ... but a model vocabulary smaller than the tokenizer's is an error */
    ck_assert_int_eq(mkv_tokenizer_json_load(path, NULL, 10, &t, NULL, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "outside the model's vocabulary"), "%s", err.msg);
}
END_TEST

/* The four byte-level rule sets on inputs where they differ (worked out
 * from each regex by hand; ids: byte b is id b, merges 256.., "xyz" 263). */
START_TEST(test_byte_level_by_hand)
{
    struct {
        const char *name, *section;
        int twelve[3], n12; /* " 12" */
        int bang[2], nbang; /* "!a" */
        int digits[4], nd;  /* "1234" */
        int xyz[3], nxyz;   /* "xyz": LLaMA-3 takes a whole pre-token found in the vocabulary */
    } sets[] = {
        {"gpt2", PRE_GPT2, {259, 50}, 2, {33, 97}, 2, {261, 52}, 2, {120, 121, 122}, 3},
        {"llama3", PRE_LLAMA3, {32, 260}, 2, {262}, 1, {261, 52}, 2, {BL_XYZ}, 1},
        {"qwen2", PRE_QWEN2, {32, 49, 50}, 3, {262}, 1, {49, 50, 51, 52}, 4, {120, 121, 122}, 3},
        {"smollm", PRE_SMOLLM, {32, 49, 50}, 3, {33, 97}, 2, {49, 50, 51, 52}, 4, {120, 121, 122}, 3},
    };
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        char name[64];
        snprintf(name, sizeof name, "byte-level-%s.json", sets[k].name);
        const char *path = tmp_path(name);
        write_byte_level_json(path, sets[k].section, k == 2 ? "{\"type\": \"NFC\"}" : "null", k % 2);
        mkv_tokenizer *t;
        mkv_error err;
        ck_assert_msg(mkv_tokenizer_json_load(path, NULL, 300, &t, NULL, &err) == MKV_OK, "%s: %s",
                      sets[k].name, err.msg);
        const int the[] = {116, 257, 258};
        expect_ids(t, "the the", 0, the, 3, sets[k].name);
        expect_ids(t, " 12", 0, sets[k].twelve, (size_t)sets[k].n12, sets[k].name);
        expect_ids(t, "!a", 0, sets[k].bang, (size_t)sets[k].nbang, sets[k].name);
        expect_ids(t, "1234", 0, sets[k].digits, (size_t)sets[k].nd, sets[k].name);
        expect_ids(t, "xyz", 0, sets[k].xyz, (size_t)sets[k].nxyz, sets[k].name);
        const int chat[] = {BL_IM_START, 116, 257, BL_IM_END};
        expect_ids(t, "<|im_start|>the<|im_end|>", MKV_ENCODE_SPECIAL, chat, 4, sets[k].name);
        /* No BOS anywhere: the files name none. */
        ck_assert_int_eq(t->bos_id, -1);
        int32_t ids[] = {BL_IM_START, 258, 259, 50, 299, 0xC3, 0xA9, BL_EOT};
        char *text = decode(t, ids, 8);
        ck_assert_str_eq(text, " the 12\xc3\xa9");
        free(text);
        mkv_tokenizer_free(t);
    }
}
END_TEST

/* ------------------------------------------------------------ Qwen2 vs model_ref.py */

static void qwen2_config(mkv_model_config *c)
{
    mkv_model_config_defaults(c);
    snprintf(c->name, sizeof c->name, "qwen2-tiny");
    c->dim = 48;
    c->hidden_dim = 80;
    c->n_layers = 2;
    c->n_heads = 6;
    c->n_kv_heads = 2;
    c->head_dim = 8;
    c->rope_dim = 8;
    c->vocab_size = 300;
    c->max_seq_len = 64;
    c->rope_theta = 1000000.0;
    c->rope_layout = MKV_ROPE_HALF;
    c->rms_eps = 1e-6f;
    c->tied_classifier = 0;
    c->has_qkv_bias = 1;
    c->bos_id = -1;
    c->eos_id = BL_EOT;
}

static mkv_model *random_model(const mkv_model_config *c, uint64_t seed)
{
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_model_create(c, &m, &err) == MKV_OK, "%s", err.msg);
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    test_fill(m->tok_embedding, (size_t)c->vocab_size * dim, &seed, 0.0, 1.0);
    for (int l = 0; l < c->n_layers; l++) {
        mkv_layer_weights *w = &m->layers[l];
        test_fill(w->rms_att, dim, &seed, 1.0, 0.2);
        test_fill(w->rms_ffn, dim, &seed, 1.0, 0.2);
        test_fill(w->wq, qd * dim, &seed, 0.0, 0.3);
        test_fill(w->wk, kvd * dim, &seed, 0.0, 0.3);
        test_fill(w->wv, kvd * dim, &seed, 0.0, 0.3);
        test_fill(w->wo, dim * qd, &seed, 0.0, 0.3);
        test_fill(w->w1, hid * dim, &seed, 0.0, 0.3);
        test_fill(w->w2, dim * hid, &seed, 0.0, 0.3);
        test_fill(w->w3, hid * dim, &seed, 0.0, 0.3);
        if (c->has_qkv_bias) {
            test_fill(w->bq, qd, &seed, 0.0, 0.5);
            test_fill(w->bk, kvd, &seed, 0.0, 0.5);
            test_fill(w->bv, kvd, &seed, 0.0, 0.5);
        }
    }
    test_fill(m->rms_final, dim, &seed, 1.0, 0.2);
    if (!c->tied_classifier)
        test_fill(m->classifier, (size_t)c->vocab_size * dim, &seed, 0.0, 0.5);
    return m;
}

/* The same weights as model_ref.py reads them: a llama2.c version-0
 * checkpoint (head_dim = dim / n_heads) and a bias file. */
static void write_llama2c(const char *path, const mkv_model *m)
{
    const mkv_model_config *c = &m->cfg;
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    int32_t h[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                    c->tied_classifier ? c->vocab_size : -c->vocab_size, c->max_seq_len};
    fwrite(h, sizeof h, 1, fp);
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    fwrite(m->tok_embedding, sizeof(float), (size_t)c->vocab_size * dim, fp);
    for (int k = 0; k < 9; k++)
        for (int l = 0; l < c->n_layers; l++) {
            const mkv_layer_weights *w = &m->layers[l];
            const float *p[9] = {w->rms_att, w->wq, w->wk, w->wv, w->wo, w->rms_ffn, w->w1, w->w2, w->w3};
            size_t s[9] = {dim, qd * dim, kvd * dim, kvd * dim, dim * qd, dim, hid * dim, dim * hid, hid * dim};
            fwrite(p[k], sizeof(float), s[k], fp);
        }
    fwrite(m->rms_final, sizeof(float), dim, fp);
    float zero = 0.0f;
    for (size_t i = 0; i < (size_t)c->max_seq_len * c->head_dim; i++)
        fwrite(&zero, sizeof zero, 1, fp);
    if (!c->tied_classifier)
        fwrite(m->classifier, sizeof(float), (size_t)c->vocab_size * dim, fp);
    ck_assert_int_eq(fclose(fp), 0);
}

static void write_biases(const char *path, const mkv_model *m)
{
    const mkv_model_config *c = &m->cfg;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    for (int l = 0; l < c->n_layers; l++) {
        fwrite(m->layers[l].bq, sizeof(float), qd, fp);
        fwrite(m->layers[l].bk, sizeof(float), kvd, fp);
        fwrite(m->layers[l].bv, sizeof(float), kvd, fp);
    }
    ck_assert_int_eq(fclose(fp), 0);
}

/* Logits [n][vocab] of model_ref.py's float64 forward pass over m's
 * weights (written as a llama2.c checkpoint, plus biases when m has them),
 * with `args` for RoPE and eps; NULL when python3 with numpy or the script
 * is missing. */
static double *reference_logits(const mkv_model *m, const int32_t *ids, size_t n, const char *tag,
                                const char *args)
{
    if (!test_python() || !test_ref_script())
        return NULL;
    char name[3][128];
    snprintf(name[0], sizeof name[0], "%s.bin", tag);
    snprintf(name[1], sizeof name[1], "%s.bias", tag);
    snprintf(name[2], sizeof name[2], "%s.f64", tag);
    const char *ckpt = tmp_path(name[0]), *bias = tmp_path(name[1]), *out = tmp_path(name[2]);
    const mkv_model_config *c = &m->cfg;
    write_llama2c(ckpt, m);
    char cmd[8192], list[2048] = "", bias_arg[4500] = "";
    if (c->has_qkv_bias) {
        write_biases(bias, m);
        snprintf(bias_arg, sizeof bias_arg, "--bias '%s'", bias);
    }
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", (int)ids[i]);
    snprintf(cmd, sizeof cmd, "'%s' '%s' forward '%s' '%s' --tokens %s %s %s", test_python(), test_ref_script(),
             ckpt, out, list, args, bias_arg);
    ck_assert_msg(system(cmd) == 0, "reference failed: %s", cmd);
    FILE *fp = fopen(out, "rb");
    ck_assert_ptr_nonnull(fp);
    size_t per_layer = (size_t)(c->n_heads + 3 * c->n_kv_heads) * n * c->head_dim;
    size_t V = (size_t)c->vocab_size;
    double *ref = malloc(n * V * sizeof(double));
    ck_assert_ptr_nonnull(ref);
    ck_assert_int_eq(fseek(fp, (long)(per_layer * c->n_layers * sizeof(double)), SEEK_SET), 0);
    ck_assert_uint_eq(fread(ref, sizeof(double), n * V, fp), n * V);
    fclose(fp);
    return ref;
}

/* max |a - ref| / max |ref|, asserting the reference is not all zero. */
static double rel_error_ref(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    ck_assert(den > 1e-3);
    return num / den;
}

static const char *write_qwen2_dir(const char *name, mkv_model **weights)
{
    mkv_model_config c;
    qwen2_config(&c);
    mkv_model *m = random_model(&c, 2024);
    const char *dir = make_dir(name);
    hf_tensors t = hf_from_model(m, 0);
    write_weights(dir, &t, 1);
    hf_tensors_free(&t);
    write_config(dir, &c, "Qwen2ForCausalLM",
                 "\"use_sliding_window\": false, \"sliding_window\": 32, \"max_window_layers\": 2", NULL);
    write_byte_level_json(in_dir(dir, "tokenizer.json"), PRE_QWEN2, "{\"type\": \"NFC\"}", 0);
    write_text(in_dir(dir, "tokenizer_config.json"),
               "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\", \"chat_template\": ["
               "{\"name\": \"tool_use\", \"template\": \"tools\"}, {\"name\": \"default\", \"template\": \"chat\"}]}");
    *weights = m;
    return dir;
}

START_TEST(test_qwen2_matches_reference)
{
    mkv_model *orig;
    const char *dir = write_qwen2_dir("qwen2", &orig);
    mkv_model *m;
    mkv_tokenizer *t;
    mkv_hf_info info;
    load_hf(dir, &m, &t, &info);
    ck_assert_str_eq(info.architecture, "Qwen2ForCausalLM");
    ck_assert_str_eq(info.chat_template, "chat");
    ck_assert_int_eq(info.add_bos, 0);
    ck_assert_int_eq(m->cfg.has_qkv_bias, 1);
    ck_assert_int_eq(m->cfg.max_seq_len, 64); /* sliding window off */
    ck_assert_int_eq(t->eos_id, BL_IM_END);   /* tokenizer_config over config.json */
    ck_assert_int_eq(m->cfg.eos_id, BL_IM_END);
    ck_assert_int_eq(t->vocab_size, 300);
    ck_assert(memcmp(m->layers[1].bk, orig->layers[1].bk, 16 * sizeof(float)) == 0);

    size_t n;
    int32_t *ids = encode_flags(t, "<|im_start|>the 1234!a the<|im_end|> xyz", MKV_ENCODE_SPECIAL, &n);
    ck_assert_uint_ge(n, 10);
    double *ref = reference_logits(orig, ids, n, "qwen2", "--rope-layout half --rope-theta 1000000 --eps 1e-6");
    if (!ref) {
        printf("check_hf: Qwen2 vs model_ref.py skipped: python3 with numpy or tests/model_ref.py not found\n");
    } else {
        float *logits = all_logits(m, ids, n);
        double e = rel_error_ref(logits, ref, n * (size_t)m->cfg.vocab_size);
        ck_assert_msg(e <= 1e-4, "Qwen2 logits vs model_ref.py: relative error %.3g", e);
        free(ref);
        free(logits);
    }
    free(ids);
    mkv_hf_info_free(&info);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
    mkv_model_free(orig);
}
END_TEST

/* ------------------------------------------------------------ RoPE scaling vs model_ref.py */

/* Llama 3.1's rope_scaling with the context scaled down to the test model:
 * head_dim 8 and theta 10000 give wavelengths 2 pi x (1, 10, 100, 1000),
 * so against 160 / 4 and 160 / 1 pair 0 keeps its frequency, pair 1 is
 * blended and pairs 2 and 3 are divided by 8. */
#define LLAMA3_PARAMS "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, " \
                      "\"original_max_position_embeddings\": 160"
#define LLAMA3_REF_ARGS "--rope-layout half --rope-theta 10000 --eps 1e-6 --rope-scaling llama3 " \
                        "--factor 8 --low-freq-factor 1 --high-freq-factor 4 --original-max-pos 160"

/* A LLaMA directory (random weights, no tokenizer) whose config.json has
 * `scaling` in place of "rope_scaling": null. */
static const char *write_scaled_llama(const char *name, const char *scaling, mkv_model **weights)
{
    mkv_model_config c;
    qwen2_config(&c);
    c.has_qkv_bias = 0;
    c.rope_theta = 10000.0;
    mkv_model *m = random_model(&c, 31);
    const char *dir = make_dir(name);
    hf_tensors t = hf_from_model(m, 0);
    write_weights(dir, &t, 1);
    hf_tensors_free(&t);
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null", scaling);
    *weights = m;
    return dir;
}

/* Logits of m with and without its RoPE frequency factors differ by more
 * than `at_least` (relative): the scaling is not lost in the noise. */
static void expect_scaling_matters(mkv_model *m, const int32_t *ids, size_t n, const float *scaled,
                                   double at_least)
{
    m->cfg.has_rope_freq_factors = 0;
    float *plain = all_logits(m, ids, n);
    m->cfg.has_rope_freq_factors = 1;
    double d = rel_error(plain, scaled, n * (size_t)m->cfg.vocab_size);
    ck_assert_msg(d > at_least, "scaled and plain RoPE logits differ by only %.3g", d);
    free(plain);
}

START_TEST(test_llama3_rope_matches_reference)
{
    mkv_model *orig, *m;
    mkv_error err;
    const char *dir = write_scaled_llama("llama3-rope", "\"rope_scaling\": {\"rope_type\": \"llama3\", "
                                         LLAMA3_PARAMS "}", &orig);
    ck_assert_msg(mkv_hf_load(dir, &m, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    const mkv_model_config *c = &m->cfg;
    ck_assert_int_eq(c->has_rope_freq_factors, 1);
    ck_assert(c->rope_theta == 10000.0);
    /* pair 1: wavelength 20 pi, s = (160 / (20 pi) - 1) / (4 - 1) */
    double s = (160.0 / (20.0 * 3.14159265358979324) - 1.0) / 3.0;
    ck_assert(c->rope_freq_factors[0] == 1.0f);
    ck_assert_msg(fabs(c->rope_freq_factors[1] - 1.0 / ((1.0 - s) / 8.0 + s)) < 1e-6, "pair 1: %g",
                  (double)c->rope_freq_factors[1]);
    ck_assert(c->rope_freq_factors[2] == 8.0f && c->rope_freq_factors[3] == 8.0f);

    enum { N = 40 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 37 + 5) % 300);
    float *logits = all_logits(m, ids, N);
    double *ref = reference_logits(orig, ids, N, "llama3", LLAMA3_REF_ARGS);
    if (!ref) {
        printf("check_hf: llama3 RoPE vs model_ref.py skipped: python3 with numpy or tests/model_ref.py not found\n");
    } else {
        double e = rel_error_ref(logits, ref, N * (size_t)c->vocab_size);
        ck_assert_msg(e <= 1e-4, "llama3 RoPE logits vs model_ref.py: relative error %.3g", e);
        free(ref);
    }
    expect_scaling_matters(m, ids, N, logits, 1e-2);

    /* transformers 5 writes rope_parameters, whose rope_theta wins over the
     * top-level one: the same frequencies. */
    mkv_model_config v5;
    write_config(dir, c, "LlamaForCausalLM", "\"rope_parameters\": {\"rope_type\": \"llama3\", "
                 "\"rope_theta\": 10000.0, " LLAMA3_PARAMS "}", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_theta\": 10000.0,", "\"rope_theta\": 500000.0,");
    ck_assert_msg(mkv_hf_read_config(dir, &v5, &err) == MKV_OK, "%s", err.msg);
    ck_assert(v5.rope_theta == 10000.0 && v5.has_rope_freq_factors);
    ck_assert(memcmp(v5.rope_freq_factors, c->rope_freq_factors, 4 * sizeof(float)) == 0);
    free(logits);
    mkv_model_free(m);
    mkv_model_free(orig);
}
END_TEST

START_TEST(test_linear_rope_matches_reference)
{
    mkv_model *orig, *m;
    mkv_error err;
    const char *dir = write_scaled_llama("linear-rope", "\"rope_scaling\": {\"type\": \"linear\", "
                                         "\"factor\": 4}", &orig);
    ck_assert_msg(mkv_hf_load(dir, &m, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(m->cfg.has_rope_freq_factors, 1);
    for (int j = 0; j < 4; j++)
        ck_assert(m->cfg.rope_freq_factors[j] == 4.0f);
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 53 + 11) % 300);
    float *logits = all_logits(m, ids, N);
    double *ref = reference_logits(orig, ids, N, "linear", "--rope-layout half --rope-theta 10000 "
                                   "--eps 1e-6 --rope-scaling linear --factor 4");
    if (!ref) {
        printf("check_hf: linear RoPE vs model_ref.py skipped: python3 with numpy or tests/model_ref.py not found\n");
    } else {
        double e = rel_error_ref(logits, ref, N * (size_t)m->cfg.vocab_size);
        ck_assert_msg(e <= 1e-4, "linear RoPE logits vs model_ref.py: relative error %.3g", e);
        free(ref);
    }
    expect_scaling_matters(m, ids, N, logits, 1e-2);
    free(logits);
    mkv_model_free(m);
    mkv_model_free(orig);
}
END_TEST

/* ------------------------------------------------------------ errors */

/* A small valid LLaMA directory (random weights, tiny tokenizer) to corrupt. */
static const char *write_small_llama(const char *name, hf_tensors *tensors, mkv_model **weights,
                                     mkv_model_config *cfg)
{
    mkv_model_config c;
    qwen2_config(&c);
    c.has_qkv_bias = 0;
    c.rope_theta = 10000.0;
    c.vocab_size = 20;
    c.eos_id = 2;
    mkv_model *m = random_model(&c, 7);
    const char *dir = make_dir(name);
    *tensors = hf_from_model(m, 0);
    write_weights(dir, tensors, 1);
    write_config(dir, &c, arch_of(&c), "", NULL);
    write_small_spm(in_dir(dir, "tokenizer.json"), SMALL_LEGACY);
    *weights = m;
    *cfg = c;
    return dir;
}

/* Expect mkv_hf_load(dir) to fail with code and a message containing
 * each of the strings. */
#define expect_load_error(dir, code, ...) expect_load_error_(dir, code, (const char *const[]){__VA_ARGS__, NULL})
static void expect_load_error_(const char *dir, int code, const char *const *parts)
{
    mkv_model *m = (mkv_model *)1;
    mkv_tokenizer *t = (mkv_tokenizer *)1;
    mkv_hf_info info;
    mkv_error err;
    int rc = mkv_hf_load(dir, &m, &t, &info, &err);
    ck_assert_msg(rc == code, "%s: status %d, want %d (%s)", dir, rc, code, rc ? err.msg : "");
    ck_assert_ptr_null(m);
    ck_assert_ptr_null(t);
    ck_assert_ptr_null(info.chat_template);
    for (; *parts; parts++)
        ck_assert_msg(strstr(err.msg, *parts), "message '%s' lacks '%s'", err.msg, *parts);
}

START_TEST(test_small_llama_loads)
{
    hf_tensors t;
    mkv_model *orig, *m;
    mkv_model_config c;
    const char *dir = write_small_llama("small-ok", &t, &orig, &c);
    mkv_tokenizer *tok;
    mkv_hf_info info;
    write_text(in_dir(dir, "chat_template.jinja"), "{{ messages }}\n");
    load_hf(dir, &m, &tok, &info);
    ck_assert_str_eq(info.chat_template, "{{ messages }}\n"); /* no tokenizer_config.json */
    ck_assert_int_eq(m->cfg.has_qkv_bias, 0);
    ck_assert_int_eq(m->cfg.tied_classifier, 0);
    ck_assert_int_eq(tok->vocab_size, 20);
    ck_assert(memcmp(m->classifier, orig->classifier, 20 * 48 * sizeof(float)) == 0);
    ck_assert(memcmp(m->layers[1].w2, orig->layers[1].w2, 48 * 80 * sizeof(float)) == 0);
    ck_assert(fabs(m->cfg.rms_eps - 1e-6f) < 1e-12 && m->cfg.rope_theta == 10000.0);
    mkv_hf_info_free(&info);
    mkv_tokenizer_free(tok);
    mkv_model_free(m);

    /* Without a tokenizer request the directory needs no tokenizer.json. */
    ck_assert_int_eq(unlink(in_dir(dir, "tokenizer.json")), 0);
    mkv_error err;
    ck_assert_msg(mkv_hf_load(dir, &m, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    mkv_model_free(m);
    expect_load_error(dir, MKV_EIO, "tokenizer.json");

    /* A sliding window narrower than the context caps max_seq_len. */
    write_config(dir, &c, "MistralForCausalLM", "\"sliding_window\": 16", NULL);
    mkv_model_config read;
    ck_assert_int_eq(mkv_hf_read_config(dir, &read, &err), MKV_OK);
    ck_assert_int_eq(read.max_seq_len, 16);
    ck_assert_int_eq(read.rope_layout, MKV_ROPE_HALF);
    ck_assert_int_eq(read.rope_dim, 8);
    write_config(dir, &c, "LlamaForCausalLM", "\"partial_rotary_factor\": 0.5", NULL);
    ck_assert_int_eq(mkv_hf_read_config(dir, &read, &err), MKV_OK);
    ck_assert_int_eq(read.rope_dim, 4);
    write_config(dir, &c, "LlamaForCausalLM", "\"partial_rotary_factor\": 0.3", NULL);
    ck_assert_int_eq(mkv_hf_read_config(dir, &read, &err), MKV_EFORMAT);
    hf_tensors_free(&t);
    mkv_model_free(orig);
}
END_TEST

START_TEST(test_config_errors)
{
    hf_tensors t;
    mkv_model *orig;
    mkv_model_config c;
    const char *dir = write_small_llama("bad-config", &t, &orig, &c);
    write_config(dir, &c, "LlamaForCausalLM", "", "hidden_size");
    expect_load_error(dir, MKV_EFORMAT, "config.json", "hidden_size", "missing");
    write_config(dir, &c, "LlamaForCausalLM", "", "num_hidden_layers");
    expect_load_error(dir, MKV_EFORMAT, "num_hidden_layers");
    write_config(dir, &c, "GPTNeoXForCausalLM", "", NULL);
    expect_load_error(dir, MKV_EUNSUP, "GPTNeoXForCausalLM", "not supported");
    /* RoPE scalings that change more than the frequencies, and bad parameters */
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null",
              "\"rope_scaling\": {\"factor\": 4.0, \"original_max_position_embeddings\": 32, "
              "\"rope_type\": \"yarn\"}");
    expect_load_error(dir, MKV_EUNSUP, "rope_scaling", "'yarn'", "not supported");
    write_config(dir, &c, "LlamaForCausalLM", "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2}", NULL);
    expect_load_error(dir, MKV_EUNSUP, "rope_parameters", "'dynamic'");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null",
              "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
              "\"rope_type\": \"llama3\"}");
    expect_load_error(dir, MKV_EFORMAT, "rope_scaling.original_max_position_embeddings is missing");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null",
              "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0, "
              "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}");
    expect_load_error(dir, MKV_EFORMAT, "high_freq_factor = 4 must exceed low_freq_factor = 4");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null",
              "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 0}");
    expect_load_error(dir, MKV_EFORMAT, "rope_scaling.factor must be a number > 0");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": 3}");
    expect_load_error(dir, MKV_EFORMAT, "rope_type must be a string");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    expect_load_error(dir, MKV_EUNSUP, "gelu");
    write_config(dir, &c, "LlamaForCausalLM", "\"attention_bias\": true", NULL);
    expect_load_error(dir, MKV_EUNSUP, "attention_bias");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4");
    expect_load_error(dir, MKV_EFORMAT, "n_kv_heads");
    write_config(dir, &c, "LlamaForCausalLM", "", NULL);
    edit_file(in_dir(dir, "config.json"), "\"vocab_size\": 20", "\"vocab_size\": \"20\"");
    expect_load_error(dir, MKV_EFORMAT, "vocab_size", "integer");
    write_text(in_dir(dir, "config.json"), "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ");
    expect_load_error(dir, MKV_EFORMAT, "config.json", "JSON");
    write_text(in_dir(dir, "config.json"), "[1, 2]");
    expect_load_error(dir, MKV_EFORMAT, "config.json");
    /* An absurd (but consistent) shape: refused for memory before any read. */
    mkv_model_config huge = c;
    huge.dim = 65536;
    huge.hidden_dim = 1 << 20;
    huge.n_layers = 1024;
    huge.n_heads = 512;
    huge.n_kv_heads = 512;
    write_config(dir, &huge, "LlamaForCausalLM", "", NULL);
    if (test_file_exists("/proc/meminfo"))
        expect_load_error(dir, MKV_ENOMEM, "GiB", "float32");
    ck_assert_int_eq(unlink(in_dir(dir, "config.json")), 0);
    expect_load_error(dir, MKV_EIO, "config.json");
    hf_tensors_free(&t);
    mkv_model_free(orig);
}
END_TEST

START_TEST(test_weight_errors)
{
    hf_tensors t;
    mkv_model *orig;
    mkv_model_config c;
    const char *dir = write_small_llama("bad-weights", &t, &orig, &c);
    const char *st = in_dir(dir, "model.safetensors");

    hf_tensors missing = t;
    missing.e = malloc((size_t)t.n * sizeof *t.e);
    memcpy(missing.e, t.e, (size_t)t.n * sizeof *t.e);
    remove_entry(&missing, "model.layers.1.mlp.up_proj.weight");
    write_safetensors(st, missing.e, missing.n);
    expect_load_error(dir, MKV_EFORMAT, "model.layers.1.mlp.up_proj.weight", "missing");
    memcpy(missing.e, t.e, (size_t)t.n * sizeof *t.e);
    missing.n = t.n;
    remove_entry(&missing, "lm_head.weight"); /* untied needs lm_head */
    write_safetensors(st, missing.e, missing.n);
    expect_load_error(dir, MKV_EFORMAT, "lm_head.weight", "missing");
    free(missing.e);

    /* k_proj given q_proj's [48, 48] instead of [16, 48] */
    st_entry *k = entry(&t, "model.layers.0.self_attn.k_proj.weight"), saved = *k;
    *k = *entry(&t, "model.layers.0.self_attn.q_proj.weight");
    strcpy(k->name, saved.name);
    write_safetensors(st, t.e, t.n);
    expect_load_error(dir, MKV_EFORMAT, "model.layers.0.self_attn.k_proj.weight", "[48, 48]",
                      "config.json implies [16, 48]");
    *k = saved;

    k->dtype = "I8";
    write_safetensors(st, t.e, t.n);
    expect_load_error(dir, MKV_EUNSUP, "k_proj", "I8");
    k->dtype = "F32";

    /* a tensor the loader does not know: an o_proj bias */
    hf_tensors extra = t;
    extra.e = malloc(((size_t)t.n + 1) * sizeof *t.e);
    memcpy(extra.e, t.e, (size_t)t.n * sizeof *t.e);
    extra.e[extra.n++] = (st_entry){"model.layers.0.self_attn.o_proj.bias", "F32", 1, {48, 0}, orig->rms_final};
    write_safetensors(st, extra.e, extra.n);
    expect_load_error(dir, MKV_EUNSUP, "o_proj.bias", "LlamaForCausalLM", "refusing");
    free(extra.e);

    /* a NaN inside a weight */
    float *copy = malloc(48 * sizeof(float));
    memcpy(copy, orig->rms_final, 48 * sizeof(float));
    copy[17] = NAN;
    st_entry *norm = entry(&t, "model.norm.weight");
    const float *keep = norm->data;
    norm->data = copy;
    write_safetensors(st, t.e, t.n);
    expect_load_error(dir, MKV_EFORMAT, "model.norm.weight", "non-finite", "17");
    norm->data = keep;
    free(copy);

    /* a truncated file */
    write_safetensors(st, t.e, t.n);
    ck_assert_int_eq(truncate(st, 1000), 0);
    expect_load_error(dir, MKV_EFORMAT, "model.safetensors");
    ck_assert_int_eq(unlink(st), 0);
    expect_load_error(dir, MKV_EIO, "neither model.safetensors");

    /* Qwen2 needs its biases */
    write_config(dir, &c, "Qwen2ForCausalLM", "", NULL);
    write_safetensors(st, t.e, t.n);
    expect_load_error(dir, MKV_EFORMAT, "q_proj.bias", "missing");
    hf_tensors_free(&t);
    mkv_model_free(orig);
}
END_TEST

START_TEST(test_index_errors)
{
    hf_tensors t;
    mkv_model *orig;
    mkv_model_config c;
    const char *dir = write_small_llama("bad-index", &t, &orig, &c);
    ck_assert_int_eq(unlink(in_dir(dir, "model.safetensors")), 0);
    write_weights(dir, &t, 2);
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_hf_load(dir, &m, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert(memcmp(m->classifier, orig->classifier, 20 * 48 * sizeof(float)) == 0);
    mkv_model_free(m);

    const char *index = in_dir(dir, "model.safetensors.index.json");
    char *good = read_text(index);
    ck_assert_int_eq(unlink(in_dir(dir, "model-00002-of-00002.safetensors")), 0);
    expect_load_error(dir, MKV_EIO, "model-00002-of-00002.safetensors", "index.json");
    write_weights(dir, &t, 2);
    /* the index names a shard that does not exist */
    edit_file(index, "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"",
              "\"lm_head.weight\": \"model-00003-of-00002.safetensors\"");
    expect_load_error(dir, MKV_EIO, "model-00003-of-00002.safetensors", "lm_head.weight");
    /* ... or a shard that lacks the tensor */
    write_text(index, good);
    edit_file(index, "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"",
              "\"lm_head.weight\": \"model-00001-of-00002.safetensors\"");
    expect_load_error(dir, MKV_EFORMAT, "model-00001-of-00002.safetensors", "lm_head.weight");
    write_text(index, good);
    edit_file(index, ",\n  \"model.norm.weight\": \"model-00002-of-00002.safetensors\"", "");
    expect_load_error(dir, MKV_EFORMAT, "model.norm.weight", "weight_map");
    write_text(index, good);
    edit_file(index, "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"", "\"lm_head.weight\": \"../x\"");
    expect_load_error(dir, MKV_EFORMAT, "invalid shard name");
    write_text(index, "{\"weight_map\": {\"a\": ");
    expect_load_error(dir, MKV_EFORMAT, "index.json", "JSON");
    write_text(index, "{\"metadata\": {}}");
    expect_load_error(dir, MKV_EFORMAT, "weight_map");
    free(good);
    hf_tensors_free(&t);
    mkv_model_free(orig);
}
END_TEST

static void expect_tokenizer_error(const char *text, int code, const char *msg)
{
    const char *path = tmp_path("bad-tokenizer.json");
    write_text(path, text);
    mkv_tokenizer *t = (mkv_tokenizer *)1;
    mkv_error err;
    int rc = mkv_tokenizer_json_load(path, NULL, 0, &t, NULL, &err);
    ck_assert_msg(rc == code, "status %d, want %d (%s) for %s", rc, code, rc ? err.msg : "", text);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, msg) && strstr(err.msg, path), "message '%s' lacks '%s' or the path", err.msg, msg);
}

START_TEST(test_tokenizer_errors)
{
    const char *spm_head = "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \""
                           SPACE_MARK "\"}, \"model\": ";
    char buf[2048];
    expect_tokenizer_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", MKV_EFORMAT, "JSON");
    expect_tokenizer_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", MKV_EUNSUP, "Unigram");
    expect_tokenizer_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", MKV_EUNSUP, "WordPiece");
    expect_tokenizer_error("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", "
                           "\"vocab\": {\"a\": 0}, \"merges\": []}}", MKV_EUNSUP, "Whitespace");
    expect_tokenizer_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", MKV_EUNSUP,
                           "neither a byte-level");
    expect_tokenizer_error("{\"pre_tokenizer\": " SPLIT_SECTION("\\\\w+|\\\\d") ", \"model\": {\"type\": \"BPE\", "
                           "\"vocab\": {\"a\": 0}, \"merges\": []}}", MKV_EUNSUP, "\\w+|\\d");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", spm_head);
    expect_tokenizer_error(buf, MKV_EFORMAT, "merges[0]");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}", spm_head);
    expect_tokenizer_error(buf, MKV_EFORMAT, "merges[0]");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", spm_head);
    expect_tokenizer_error(buf, MKV_EFORMAT, "id 0");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", spm_head);
    expect_tokenizer_error(buf, MKV_EFORMAT, "no valid id");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", spm_head);
    expect_tokenizer_error(buf, MKV_EFORMAT, "empty");
    snprintf(buf, sizeof buf, "%s{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
             "\"continuing_subword_prefix\": \"##\"}}", spm_head);
    expect_tokenizer_error(buf, MKV_EUNSUP, "continuing-subword");
    expect_tokenizer_error("{\"normalizer\": {\"type\": \"NFKC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, "
                           "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", MKV_EUNSUP, "NFKC");
    /* byte-level merge whose result is not in the vocabulary */
    expect_tokenizer_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
                           "\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}", MKV_EFORMAT,
                           "merged piece");
    expect_tokenizer_error("[]", MKV_EFORMAT, "not a JSON object");
    /* an added token whose id model.vocab spells otherwise, or whose
     * "special" is not a boolean */
    snprintf(buf, sizeof buf, "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}], "
             "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \""
             SPACE_MARK "\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}");
    expect_tokenizer_error(buf, MKV_EFORMAT, "added_tokens[0] '<s>' has id 1, which model.vocab gives to 'b'");
    snprintf(buf, sizeof buf, "{\"added_tokens\": [{\"id\": 2, \"content\": \"<s>\", \"special\": \"yes\"}], "
             "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \""
             SPACE_MARK "\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}");
    expect_tokenizer_error(buf, MKV_EFORMAT, "added_tokens[0] '<s>': \"special\" must be true or false");
}
END_TEST

int main(void)
{
    int have_models = test_models_dir() != NULL, have_fixture = test_write_fixture("check_hf");
    Suite *s = suite_create("hf");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_spm_rank_merges_by_hand);
    tcase_add_test(tc, test_byte_level_by_hand);
    tcase_add_test(tc, test_qwen2_matches_reference);
    tcase_add_test(tc, test_llama3_rope_matches_reference);
    tcase_add_test(tc, test_linear_rope_matches_reference);
    tcase_add_test(tc, test_small_llama_loads);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_weight_errors);
    tcase_add_test(tc, test_index_errors);
    tcase_add_test(tc, test_tokenizer_errors);
    test_add_model_loop(tc, test_llama2c_fp32, have_fixture, have_models);
    test_add_model_loop(tc, test_llama2c_sharded, have_fixture, have_models);
    test_add_model_loop(tc, test_llama2c_bf16, have_fixture, have_models);
    test_add_model_loop(tc, test_llama2c_fp16, have_fixture, have_models);
    test_add_model_loop(tc, test_spm_json_matches_llama2c, have_fixture, have_models);
    suite_add_tcase(s, tc);
    int status = test_run(s);
    if (status == EXIT_SUCCESS && !have_models)
        printf("check_hf: stories260K.bin/tok512.bin not found (set MKV_MODELS_DIR, default "
               "../shared/models): its published ids and sample through HF directories skipped\n");
    /* as in check_model: a missing published sample is said, not a skip */
    return status == EXIT_SUCCESS && !have_fixture ? 77 : status;
}
