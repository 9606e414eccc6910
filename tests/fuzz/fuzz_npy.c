/* Fuzz harness: NumPy .npy files (io/npy.h), then the import of an accepted
 * file as a KV dump (io/import.h). A file that opens must be readable in
 * full: its size matches the header exactly. */
#include "config.h"
#include "fuzz.h"
#include "io/import.h"
#include "io/npy.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("in.npy", data, size);
    mkv_error err;
    mkv_npy *f = NULL;
    int rc = mkv_npy_open(path, &f, &err);
    fuzz_check_refusal(rc, &err, "mkv_npy_open");
    if (rc)
        return 0;
    const mkv_npy_info *in = mkv_npy_info_of(f);
    if (in->data_offset + in->numel * in->elem_size != size)
        fuzz_bug("mkv_npy_open accepted %zu bytes holding %llu elements of %zu bytes from %llu", size,
                 (unsigned long long)in->numel, in->elem_size, (unsigned long long)in->data_offset);
    float buf[256];
    uint64_t n = in->numel, count = n < 256 ? n : 256;
    uint64_t firsts[2] = {0, n - count};
    for (int i = 0; i < 2; i++) {
        rc = mkv_npy_read_f32(f, firsts[i], (size_t)count, buf, &err);
        if (rc)
            fuzz_bug("mkv_npy_read_f32 of elements %llu+%llu of an accepted file: %s",
                     (unsigned long long)firsts[i], (unsigned long long)count, err.msg);
    }
    mkv_npy_close(f);

    mkv_import_opts o;
    mkv_import_opts_init(&o);
    o.kind = MKV_IMPORT_NPY;
    mkv_dump_write_opts wo;
    mkv_dump_write_opts_init(&wo);
    rc = mkv_import(path, &o, fuzz_path("out.h5"), &wo, &err);
    fuzz_check_refusal(rc, &err, "mkv_import");
    return 0;
}
