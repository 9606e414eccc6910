/* Fuzz harness: .safetensors files (io/safetensors.h), then the import of
 * an accepted file as a KV dump (io/import.h). Every tensor an accepted
 * file lists lies inside the file, is found by its name, and its bytes
 * read back. */
#include "config.h"
#include "fuzz.h"
#include "io/import.h"
#include "io/safetensors.h"

#include <string.h>

static int is_float(mkv_st_dtype t)
{
    return t == MKV_ST_F16 || t == MKV_ST_BF16 || t == MKV_ST_F32 || t == MKV_ST_F64;
}

static int is_int(mkv_st_dtype t)
{
    return t == MKV_ST_BOOL || t == MKV_ST_U8 || t == MKV_ST_I8 || t == MKV_ST_I16 || t == MKV_ST_U16 ||
           t == MKV_ST_I32 || t == MKV_ST_U32 || t == MKV_ST_I64 || t == MKV_ST_U64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("in.safetensors", data, size);
    mkv_error err;
    mkv_st_file *f = NULL;
    int rc = mkv_st_open(path, &f, &err);
    fuzz_check_refusal(rc, &err, "mkv_st_open");
    if (rc)
        return 0;
    static unsigned char raw[4096];
    static float fbuf[512];
    static int32_t ibuf[512];
    for (size_t i = 0; i < mkv_st_count(f); i++) {
        const mkv_st_tensor *t = mkv_st_tensor_at(f, i);
        if (mkv_st_find(f, t->name) != t)
            fuzz_bug("mkv_st_find('%s') is not tensor %zu", t->name, i);
        if (t->offset > size || t->nbytes > size - t->offset)
            fuzz_bug("tensor '%s' at %llu+%llu lies outside the %zu bytes", t->name,
                     (unsigned long long)t->offset, (unsigned long long)t->nbytes, size);
        if (t->nbytes != t->numel * mkv_st_dtype_size(t->dtype))
            fuzz_bug("tensor '%s': %llu bytes for %llu elements", t->name, (unsigned long long)t->nbytes,
                     (unsigned long long)t->numel);
        size_t esize = mkv_st_dtype_size(t->dtype);
        uint64_t count = t->numel < sizeof raw / esize ? t->numel : sizeof raw / esize;
        if (mkv_st_read_raw(f, t, t->numel - count, (size_t)count, raw, &err))
            fuzz_bug("mkv_st_read_raw of tensor '%s' of an accepted file: %s", t->name, err.msg);
        if (count > 512)
            count = 512;
        if (is_float(t->dtype) && mkv_st_read_f32(f, t, 0, (size_t)count, fbuf, &err))
            fuzz_bug("mkv_st_read_f32 of tensor '%s' of an accepted file: %s", t->name, err.msg);
        if (is_int(t->dtype)) {
            rc = mkv_st_read_i32(f, t, 0, (size_t)count, ibuf, &err);
            fuzz_check_refusal(rc, &err, "mkv_st_read_i32");
        }
        if (mkv_st_read_raw(f, t, t->numel, 1, raw, &err) == MKV_OK)
            fuzz_bug("mkv_st_read_raw read past the end of tensor '%s'", t->name);
    }
    mkv_st_close(f);

    mkv_import_opts o;
    mkv_import_opts_init(&o);
    o.kind = MKV_IMPORT_SAFETENSORS;
    mkv_dump_write_opts wo;
    mkv_dump_write_opts_init(&wo);
    rc = mkv_import(path, &o, fuzz_path("out.h5"), &wo, &err);
    fuzz_check_refusal(rc, &err, "mkv_import");
    return 0;
}
