/* The global heap guard (h5heap_priv.h): HDF5's sec2 and core drivers with
 * a read that walks the global heap collections it returns while a watch
 * is on. */
#include "config.h"
#include "io/h5heap_priv.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The collection layout (HDF5 file format specification, "Global Heap"):
 * "GCOL", version 1, 3 reserved bytes, the collection's size (a length:
 * sizeof_size bytes), then objects, each an index (2 bytes), a reference
 * count (2), 4 reserved bytes, its size (a length) and its data padded to 8
 * bytes; index 0 is the free space, whose size includes its header. */
#define GCOL_MIN_SIZE 4096 /* libhdf5 never makes a smaller one */

static struct {
    int on;
    unsigned sizeof_size;
    char why[160];
} watch;

static uint64_t get_length(const unsigned char *p, unsigned n, int *overflow)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) {
        if (i >= 8 && p[i])
            *overflow = 1;
        if (i < 8)
            v = v << 8 | p[i];
    }
    return v;
}

static void refuse(haddr_t addr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void refuse(haddr_t addr, const char *fmt, ...)
{
    char what[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(watch.why, sizeof watch.why, "the global heap collection at byte %llu is damaged: %s",
             (unsigned long long)addr, what);
}

/* Walk the collection c[0..len) at addr as libhdf5's loader
 * (H5HG__cache_heap_deserialize) does: 0 when the walk ends at its end,
 * else -1 with what stops it ending well. */
static int walk(const unsigned char *c, uint64_t len, unsigned L, haddr_t addr)
{
    const uint64_t objhdr = 8 + (uint64_t)L;
    uint64_t p = 8 + (uint64_t)L;
    while (p < len) {
        if (len - p < objhdr)
            break; /* too small for an object: free space */
        unsigned idx = c[p] | (unsigned)c[p + 1] << 8;
        int overflow = 0;
        uint64_t size = get_length(c + p + 8, L, &overflow), need;
        if (overflow) {
            refuse(addr, "the object at byte %llu has a size that overflows", (unsigned long long)p);
            return -1;
        }
        if (idx > 0 && size > len - p - objhdr)
            need = UINT64_MAX; /* its data alone runs past the end */
        else if (idx > 0)
            need = objhdr + ((size + 7) & ~(uint64_t)7);
        else
            need = size; /* the free space, its header included */
        if (need == 0) {
            /* libhdf5 would stay on this object forever */
            refuse(addr, "the object at byte %llu has size 0", (unsigned long long)p);
            return -1;
        }
        if (need > len - p) {
            refuse(addr, "the object at byte %llu (%llu bytes) runs past the collection's end",
                   (unsigned long long)p, (unsigned long long)size);
            return -1;
        }
        p += need;
    }
    return 0;
}

typedef herr_t (*read_fn)(H5FD_t *, H5FD_mem_t, hid_t, haddr_t, size_t, void *);

/* After a successful read: if it is a collection's start, check the whole
 * collection. Returns 0 to let the read stand, -1 to fail it. */
static int check_read(read_fn orig, H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr,
                      size_t size, const unsigned char *buf)
{
    const unsigned L = watch.sizeof_size;
    if (size < 8 + L || memcmp(buf, "GCOL\001", 5) != 0)
        return 0; /* not a collection's start (libhdf5 checks the signature) */
    int overflow = 0;
    uint64_t len = get_length(buf + 8, L, &overflow);
    if (overflow || len < GCOL_MIN_SIZE) {
        refuse(addr, "its size %llu is below 4096 bytes or overflows", (unsigned long long)len);
        return -1;
    }
    haddr_t eoa = file->cls->get_eoa(file, type);
    if (eoa == HADDR_UNDEF || addr > eoa || len > eoa - addr) {
        refuse(addr, "its size %llu runs past the end of the file", (unsigned long long)len);
        return -1;
    }
    /* the library reads the first 4096 bytes, then the rest: read it all */
    const unsigned char *c = buf;
    unsigned char *whole = NULL;
    if (len > size) {
        if (len > SIZE_MAX || !(whole = malloc((size_t)len))) {
            refuse(addr, "no memory to check its %llu bytes", (unsigned long long)len);
            return -1;
        }
        if (orig(file, type, dxpl, addr, (size_t)len, whole) < 0) {
            free(whole);
            return -1;
        }
        c = whole;
    }
    int rc = walk(c, len, L, addr);
    free(whole);
    return rc;
}

/* ---------------------------------------------------------------- drivers */

typedef struct {
    hid_t id;         /* the watched copy, registered */
    read_fn orig;     /* HDF5's own read */
    size_t fapl_size; /* the size of its settings */
} watched_driver;

static watched_driver sec2_drv = {H5I_INVALID_HID, NULL, 0}, core_drv = {H5I_INVALID_HID, NULL, 0};

static herr_t watched_read(const watched_driver *d, H5FD_t *file, H5FD_mem_t type, hid_t dxpl,
                           haddr_t addr, size_t size, void *buf)
{
    if (d->orig(file, type, dxpl, addr, size, buf) < 0)
        return -1;
    return watch.on ? check_read(d->orig, file, type, dxpl, addr, size, buf) : 0;
}

static herr_t sec2_read(H5FD_t *f, H5FD_mem_t t, hid_t x, haddr_t a, size_t n, void *b)
{
    return watched_read(&sec2_drv, f, t, x, a, n, b);
}

static herr_t core_read(H5FD_t *f, H5FD_mem_t t, hid_t x, haddr_t a, size_t n, void *b)
{
    return watched_read(&core_drv, f, t, x, a, n, b);
}

/* Register a copy of the driver that opens name with fapl (HDF5's public
 * H5FD_t names its class), with the read replaced. */
static hid_t register_copy(watched_driver *d, const char *copy_name, read_fn read,
                           const char *name, unsigned flags, hid_t fapl)
{
    if (d->id >= 0)
        return d->id;
    H5FD_t *probe = H5FDopen(name, flags, fapl, HADDR_UNDEF);
    if (!probe)
        return H5I_INVALID_HID;
    H5FD_class_t cls = *probe->cls;
    H5FDclose(probe);
    cls.name = copy_name;
    cls.terminate = NULL; /* HDF5's own driver keeps its own */
    d->orig = cls.read;
    d->fapl_size = cls.fapl_size;
    cls.read = read;
    d->id = H5FDregister(&cls);
    return d->id;
}

hid_t mkv_h5heap_fapl_file(const char *path)
{
    if (register_copy(&sec2_drv, "mkv_watched_sec2", sec2_read, path, H5F_ACC_RDONLY,
                      H5P_FILE_ACCESS_DEFAULT) < 0)
        return H5I_INVALID_HID;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_driver(fapl, sec2_drv.id, NULL) < 0) {
        H5Pclose(fapl);
        return H5I_INVALID_HID;
    }
    return fapl;
}

hid_t mkv_h5heap_fapl_image(const void *image, size_t len)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        return fapl;
    /* the core driver's settings as H5LTopen_file_image makes them, then
     * the same settings under the watched copy */
    int ok = H5Pset_fapl_core(fapl, 1 << 20, 0) >= 0 &&
             register_copy(&core_drv, "mkv_watched_core", core_read, "mkv-probe.h5",
                           H5F_ACC_RDWR | H5F_ACC_CREAT, fapl) >= 0;
    const void *core_info = ok ? H5Pget_driver_info(fapl) : NULL;
    void *info = core_info ? malloc(core_drv.fapl_size + 1) : NULL;
    if (info) {
        memcpy(info, core_info, core_drv.fapl_size);
        ok = H5Pset_driver(fapl, core_drv.id, info) >= 0 &&
             H5Pset_file_image(fapl, (void *)image, len) >= 0;
        free(info);
    }
    if (!info || !ok) {
        H5Pclose(fapl);
        return H5I_INVALID_HID;
    }
    return fapl;
}

void mkv_h5heap_watch_begin(hid_t obj)
{
    watch.on = 1;
    watch.why[0] = '\0';
    watch.sizeof_size = 8;
    hid_t fid = H5Iget_file_id(obj);
    hid_t fcpl = fid >= 0 ? H5Fget_create_plist(fid) : H5I_INVALID_HID;
    size_t sa, ss;
    if (fcpl >= 0 && H5Pget_sizes(fcpl, &sa, &ss) >= 0 && ss >= 2 && ss <= 16)
        watch.sizeof_size = (unsigned)ss;
    if (fcpl >= 0)
        H5Pclose(fcpl);
    if (fid >= 0)
        H5Fclose(fid);
}

const char *mkv_h5heap_watch_end(void)
{
    watch.on = 0;
    return watch.why[0] ? watch.why : NULL;
}
