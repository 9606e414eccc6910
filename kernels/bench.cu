/* Attention benchmark on synthetic caches (mkv_bench_attention, declared in
 * mkv_cuda.h).  Each method is a bench_method: dense decode attention (the
 * default build and, on request, the other build of its kernel) and the
 * Quest-style kernel per token budget, and the packed MosaicKV kernel per
 * budget (a whole step, and its scoring + selection alone: the scoring
 * stage's share), over synthetic packed caches built on the device once
 * per configuration.
 *
 * Timing: for each method, `warmup` steps, then `runs` steps each between
 * two events, all queued behind a spin kernel so that the GPU runs them
 * back to back whatever the host's launch rate; step i uses buffer set
 * i % n_sets, and the sets together are at least 4x the L2 size.
 *
 * Memory (peak_mem_bytes): what one decode step of the method needs on the
 * device, counted in bytes allocated (mkv_device_buffer): one cache in its
 * format (cache_bytes), the queries and the output, the plan of one cache,
 * and the most allocated at once while its steps ran (nothing, today).  Not
 * the benchmark's other buffer sets (there for the L2 only), nor the CUDA
 * context and code. */
#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "mosaic_attend.cuh"
#include "random.cuh"

namespace {

using mkv_attn::THREADS;
using mkv_random::normal_at;
using mkv_random::fill_blocks;

/* ----------------------------------------------------------- random data */

__global__ void fill_16(uint16_t *dst, size_t n, uint64_t seed, int is_bf16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = normal_at(seed, i);
        dst[i] = is_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
    }
}

__global__ void fill_f32(float *dst, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = normal_at(seed, i);
}

/* Keeps the GPU busy while the host queues the timed steps. */
__global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__global__ void count_nonfinite(const float *x, size_t n, unsigned *bad)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (!isfinite(x[i]))
            atomicAdd(bad, 1u);
}

/* ------------------------------------------------------------- one case */

struct bench_case {
    mkv_attn_shape shape;
    std::vector<int64_t> lengths;
    int n_sets = 0;
    std::vector<std::unique_ptr<mkv_device_buffer>> bufs;   /* owns everything below */
    std::vector<uint16_t *> k, v;
    std::vector<float *> q;
    float *out = nullptr;
    uint64_t set_bytes = 0;      /* K + V of one set */
    std::vector<uint16_t *> meta; /* Quest page metadata of each set (same for every budget) */
    uint64_t meta_bytes = 0;     /* of one set */
    /* Packed MosaicKV caches (their own number of sets: they are smaller). */
    struct packed_holder {
        mkv_packed_cache *c = nullptr;
        ~packed_holder() { mkv_cuda_mosaic_free(c); }
    };
    std::vector<std::unique_ptr<packed_holder>> packed;

    int alloc(void **p, size_t bytes, mkv_error *err)
    {
        std::unique_ptr<mkv_device_buffer> b(new (std::nothrow) mkv_device_buffer);
        if (!b)
            return mkv_fail(err, MKV_ENOMEM, "benchmark: out of host memory");
        cudaError_t e = b->alloc(bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return mkv_fail(err, e == cudaErrorMemoryAllocation ? MKV_ENOMEM : MKV_EGPU,
                            "benchmark: cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
        }
        *p = b->ptr;
        bufs.push_back(std::move(b));
        return MKV_OK;
    }
};

/* -------------------------------------------------------------- methods */

class bench_method {
public:
    virtual ~bench_method() {}
    virtual const char *impl() const = 0;
    virtual const char *backend() const = 0;
    virtual double budget() const { return 1.0; }
    /* Plans and derived buffers for the case (all sets). */
    virtual int setup(bench_case &c, mkv_error *err) = 0;
    /* Queue one decode step over buffer set `set`; record `mid` between
     * the selection and the attention stages (methods without a selection
     * stage record it at the start). */
    virtual int run(bench_case &c, int set, cudaStream_t st, cudaEvent_t mid, mkv_error *err) = 0;
    /* Bytes one step reads from device memory (the cache state it touches). */
    virtual uint64_t bytes_read(const bench_case &c) const = 0;
    /* Bytes of one cache (one set) in the method's format. */
    virtual uint64_t cache_bytes(const bench_case &c) const { return c.set_bytes; }
    virtual bool has_select() const { return false; }
    /* Device bytes of the plan one cache needs (measured by setup). */
    uint64_t plan_bytes = 0;
};

class dense_method : public bench_method {
    int minb_;
    std::string name_;
    mkv_dense_plan *plan_ = nullptr;

public:
    /* The default build is "mkv"; the other one "mkv-minbN". */
    explicit dense_method(int minb)
        : minb_(minb), name_(minb == mkv_attn::ATTN_MINB ? "mkv" : "mkv-minb" + std::to_string(minb)) {}
    ~dense_method() override { mkv_cuda_dense_plan_free(plan_); }
    const char *impl() const override { return "full"; }
    const char *backend() const override { return name_.c_str(); }
    int setup(bench_case &c, mkv_error *err) override
    {
        const uint64_t held = mkv_device_bytes_now();
        int rc = mkv_attn::dense_plan_variant(&c.shape, c.lengths.data(), minb_, &plan_, err);
        plan_bytes = mkv_device_bytes_now() - held;
        return rc;
    }
    int run(bench_case &c, int set, cudaStream_t st, cudaEvent_t mid, mkv_error *err) override
    {
        MKV_CUDA_CHECK(cudaEventRecord(mid, st));
        return mkv_cuda_dense_run(plan_, c.q[(size_t)set], c.k[(size_t)set], c.v[(size_t)set], c.out, st, err);
    }
    uint64_t bytes_read(const bench_case &c) const override { return c.set_bytes; }
};

class quest_method : public bench_method {
    mkv_quest_params qp_;
    mkv_quest_plan *plan_ = nullptr;

public:
    explicit quest_method(const mkv_quest_params &qp) : qp_(qp) {}
    ~quest_method() override { mkv_cuda_quest_plan_free(plan_); }
    const char *impl() const override { return "quest"; }
    const char *backend() const override { return "mkv"; }
    double budget() const override { return qp_.budget; }
    bool has_select() const override { return true; }
    int setup(bench_case &c, mkv_error *err) override
    {
        const uint64_t held = mkv_device_bytes_now();
        int rc = mkv_cuda_quest_plan(&c.shape, c.lengths.data(), NULL, &qp_, &plan_, err);
        if (rc != MKV_OK)
            return rc;
        plan_bytes = mkv_device_bytes_now() - held;
        if (c.meta.empty()) {   /* metadata depends on K and the page size only: build it once per case */
            c.meta_bytes = mkv_cuda_quest_meta_elems(plan_) * 2;
            for (int i = 0; i < c.n_sets; i++) {
                void *m = nullptr;
                if ((rc = c.alloc(&m, c.meta_bytes, err)) != MKV_OK)
                    return rc;
                c.meta.push_back((uint16_t *)m);
                if ((rc = mkv_cuda_quest_build_meta(plan_, c.k[(size_t)i], c.meta.back(), NULL, err)) != MKV_OK)
                    return rc;
            }
            MKV_CUDA_CHECK(cudaDeviceSynchronize());
        }
        return MKV_OK;
    }
    int run(bench_case &c, int set, cudaStream_t st, cudaEvent_t mid, mkv_error *err) override
    {
        int rc = mkv_cuda_quest_select(plan_, c.q[(size_t)set], c.meta[(size_t)set], st, err);
        if (rc != MKV_OK)
            return rc;
        MKV_CUDA_CHECK(cudaEventRecord(mid, st));
        return mkv_cuda_quest_attend(plan_, c.q[(size_t)set], c.k[(size_t)set], c.v[(size_t)set], c.out, st, err);
    }
    /* Every scored page's metadata and key (written, read back by the
     * select), the K and V of the tokens the last step attended, q. */
    uint64_t bytes_read(const bench_case &c) const override
    {
        const mkv_attn_shape &s = c.shape;
        const size_t heads = (size_t)s.batch * s.n_kv_heads;
        std::vector<int64_t> tokens(heads);
        mkv_error err = {};
        if (mkv_cuda_quest_selection(plan_, NULL, NULL, tokens.data(), &err) != MKV_OK)
            return 0;
        uint64_t bytes = (uint64_t)s.batch * s.n_heads * s.head_dim * 4;
        for (size_t h = 0; h < heads; h++) {
            mkv_quest_counts qc;
            if (mkv_cuda_quest_counts(plan_, (int)(h / s.n_kv_heads), &qc, &err) != MKV_OK)
                return 0;
            bytes += (uint64_t)qc.pages * (2 * s.head_dim * 2 + 2 * 4) + (uint64_t)tokens[h] * 2 * s.head_dim * 2;
        }
        return bytes;
    }
    uint64_t cache_bytes(const bench_case &c) const override { return c.set_bytes + c.meta_bytes; }
};

/* ------------------------------------------------- packed MosaicKV caches */

/* The synthetic packed caches' settings (mkv_cuda_mosaic_synth) for the
 * case: sink and recent tokens dense, the rest in segments of o->segment
 * tokens, d' and r from the options, block keys the mean over the d'
 * channels (docs/DESIGN.md 5.1). */
static mkv_packed_synth packed_synth(const bench_case &c, const mkv_bench_opts *o, uint64_t seed)
{
    const int d = o->head_dim;
    int dp = o->dprime < 32 ? 32 : o->dprime > d ? d : o->dprime;
    dp = dp / 32 * 32;
    int r = (int)ceil(o->keep * d - 1e-9);
    r = r < 1 ? 1 : r > dp ? dp : r;
    mkv_packed_synth ps = {};
    ps.head_dim = d;
    ps.block = o->block;
    ps.n_heads = c.shape.batch * c.shape.n_kv_heads;
    ps.tokens = c.shape.t_max;
    ps.sink = o->sink;
    ps.recent = o->recent;
    ps.segment = o->segment;
    ps.dprime = dp;
    ps.r = r;
    ps.kdim = dp;
    ps.kbound = 0;
    ps.seed = seed;
    return ps;
}

class packed_method : public bench_method {
    const mkv_bench_opts *o_;
    double budget_;
    bool select_only_;
    int blockkey_bits_;
    std::vector<mkv_packed_plan *> plans_;   /* one per packed set */
    int step_ = 0;

public:
    packed_method(const mkv_bench_opts *o, double budget, bool select_only, int blockkey_bits)
        : o_(o), budget_(budget), select_only_(select_only), blockkey_bits_(blockkey_bits) {}
    ~packed_method() override
    {
        for (mkv_packed_plan *p : plans_)
            mkv_cuda_mosaic_plan_free(p);
    }
    const char *impl() const override
    {
        if (blockkey_bits_ == 8)
            return select_only_ ? "mosaic-bk8-select" : "mosaic-bk8";
        return select_only_ ? "mosaic-select" : "mosaic";
    }
    const char *backend() const override { return "mkv"; }
    double budget() const override { return budget_; }
    int setup(bench_case &c, mkv_error *err) override
    {
        const mkv_attn_shape &s = c.shape;
        int rc;
        if (c.packed.empty()) {   /* the caches depend on the configuration only: built once per case */
            int dev = 0, l2 = 0;
            MKV_CUDA_CHECK(cudaGetDevice(&dev));
            MKV_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
            mkv_packed_seg g;
            const mkv_packed_synth geometry = packed_synth(c, o_, 0);
            if ((rc = mkv_cuda_mosaic_synth_segment(&geometry, &g, err)) != MKV_OK)
                return rc;
            const uint64_t per_token = (uint64_t)g.rec_bytes / o_->block + 2ull * g.bk_width / o_->block;
            const uint64_t set = per_token * (uint64_t)s.t_max * s.batch * s.n_kv_heads;
            uint64_t n = set > 0 ? (4ull * (uint64_t)l2 + set - 1) / set : 1;
            n = n < 1 ? 1 : n > 8 ? 8 : n;
            for (uint64_t i = 0; i < n; i++) {
                std::unique_ptr<bench_case::packed_holder> h(new (std::nothrow) bench_case::packed_holder);
                if (!h)
                    return mkv_fail(err, MKV_ENOMEM, "benchmark: out of host memory");
                const mkv_packed_synth ps = packed_synth(c, o_, o_->seed * 7777u + (uint64_t)s.t_max * 13u + i * 101u);
                if ((rc = mkv_cuda_mosaic_synth(&ps, &h->c, err)) != MKV_OK)
                    return rc;
                for (int b = 0; b < o_->n_blockkey_bits; b++)
                    if (o_->blockkey_bits[b] == 8 && (rc = mkv_cuda_mosaic_blockkeys8(h->c, err)) != MKV_OK)
                        return rc;
                c.packed.push_back(std::move(h));
            }
        }
        std::vector<int32_t> heads((size_t)s.batch * s.n_kv_heads);
        for (size_t i = 0; i < heads.size(); i++)
            heads[i] = (int32_t)i;
        std::vector<int64_t> pos((size_t)s.batch, s.t_max - 1);
        mkv_packed_params pp = {};
        pp.batch = s.batch;
        pp.n_kv_heads = s.n_kv_heads;
        pp.n_heads = s.n_heads;
        pp.budget = budget_;
        pp.blockkey_bits = blockkey_bits_;
        const uint64_t held = mkv_device_bytes_now();
        for (auto &h : c.packed) {
            mkv_packed_plan *p = nullptr;
            if ((rc = mkv_cuda_mosaic_plan(h->c, &pp, heads.data(), pos.data(), &p, err)) != MKV_OK)
                return rc;
            plans_.push_back(p);
        }
        plan_bytes = (mkv_device_bytes_now() - held) / plans_.size();   /* the sets' plans are alike */
        return MKV_OK;
    }
    int run(bench_case &c, int set, cudaStream_t st, cudaEvent_t mid, mkv_error *err) override
    {
        const mkv_packed_plan *p = plans_[(size_t)(step_++ % (int)plans_.size())];
        MKV_CUDA_CHECK(cudaEventRecord(mid, st));
        if (select_only_)
            return mkv_cuda_mosaic_select(p, c.q[(size_t)set], st, err);
        return mkv_cuda_mosaic_run(p, c.q[(size_t)set], c.out, st, err);
    }
    /* What the kernels read of the cache (mkv_packed_counts.device_bytes:
     * block keys and key scratch, R_k, records of the attended blocks, R_v
     * per part, dense rows, q); the selection stage alone: its share
     * (scoring_bytes) and the dense rows. */
    uint64_t bytes_read(const bench_case &c) const override
    {
        const mkv_attn_shape &s = c.shape;
        mkv_error err = {};
        uint64_t bytes = 0;
        for (int b = 0; b < s.batch; b++)
            for (int h = 0; h < s.n_kv_heads; h++) {
                mkv_packed_counts ct;
                if (mkv_cuda_mosaic_selection(plans_[0], b, h, NULL, NULL, &ct, &err) != MKV_OK)
                    return 0;
                if (!select_only_)
                    bytes += ct.device_bytes;
                else
                    bytes += ct.scoring_bytes + (uint64_t)ct.dense_tokens * s.head_dim * 4;
            }
        return bytes;
    }
    uint64_t cache_bytes(const bench_case &c) const override
    {
        return c.packed.empty() ? 0 : mkv_cuda_mosaic_bytes(c.packed[0]->c);
    }
};

/* ---------------------------------------------------------------- timing */

struct timing {
    double median = 0, p10 = 0, p90 = 0, select_median = -1;
};

static double quantile(std::vector<float> v, double q)
{
    std::sort(v.begin(), v.end());
    const double pos = q * (double)(v.size() - 1);
    const size_t i = (size_t)pos;
    const double f = pos - (double)i;
    return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

/* Events owned for one measurement. */
struct event_set {
    std::vector<cudaEvent_t> ev;
    ~event_set()
    {
        for (cudaEvent_t e : ev)
            (void)cudaEventDestroy(e);
    }
    int make(size_t n, mkv_error *err)
    {
        for (size_t i = 0; i < n; i++) {
            cudaEvent_t e;
            MKV_CUDA_CHECK(cudaEventCreate(&e));
            ev.push_back(e);
        }
        return MKV_OK;
    }
};

/* Cycles of spin that cover the host queuing `steps` steps of `launches`
 * launches each (~10 us apiece, generous), at the device clock. */
static long long spin_cycles(int steps, int launches, int clock_khz)
{
    const double us = 200.0 + 10.0 * steps * launches;
    return (long long)(us * 1e-3 * (double)clock_khz);
}

static int time_method(bench_method &m, bench_case &c, const mkv_bench_opts *o, cudaStream_t st, int clock_khz,
                       timing *t, mkv_error *err)
{
    const int runs = o->runs;
    event_set es;
    int rc = es.make((size_t)3 * runs + 1, err);
    if (rc != MKV_OK)
        return rc;
    cudaEvent_t scratch = es.ev.back();
    for (int i = 0; i < o->warmup; i++)
        if ((rc = m.run(c, i % c.n_sets, st, scratch, err)) != MKV_OK)
            return rc;
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    spin<<<1, 1, 0, st>>>(spin_cycles(runs, 5, clock_khz));
    MKV_CUDA_CHECK_LAUNCH();
    for (int i = 0; i < runs; i++) {
        MKV_CUDA_CHECK(cudaEventRecord(es.ev[(size_t)3 * i], st));
        if ((rc = m.run(c, i % c.n_sets, st, es.ev[(size_t)3 * i + 1], err)) != MKV_OK)
            return rc;
        MKV_CUDA_CHECK(cudaEventRecord(es.ev[(size_t)3 * i + 2], st));
    }
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<float> total((size_t)runs), sel((size_t)runs);
    for (int i = 0; i < runs; i++) {
        MKV_CUDA_CHECK(cudaEventElapsedTime(&total[(size_t)i], es.ev[(size_t)3 * i], es.ev[(size_t)3 * i + 2]));
        MKV_CUDA_CHECK(cudaEventElapsedTime(&sel[(size_t)i], es.ev[(size_t)3 * i], es.ev[(size_t)3 * i + 1]));
    }
    t->median = quantile(total, 0.5);
    t->p10 = quantile(total, 0.1);
    t->p90 = quantile(total, 0.9);
    t->select_median = m.has_select() ? quantile(sel, 0.5) : -1;
    return MKV_OK;
}

/* Device-to-device copy of 1 GiB: (read + write) bytes per second. */
static int measure_copy(const mkv_bench_opts *o, cudaStream_t st, int clock_khz, double *tbps, double *ms_out,
                        mkv_error *err)
{
    const size_t bytes = (size_t)1 << 30;
    mkv_device_buffer a, b;
    MKV_CUDA_CHECK(a.alloc(bytes));
    MKV_CUDA_CHECK(b.alloc(bytes));
    fill_16<<<fill_blocks(bytes / 2), 256, 0, st>>>(a.as<uint16_t>(), bytes / 2, o->seed ^ 0xc0b1u, 1);
    MKV_CUDA_CHECK_LAUNCH();
    const int runs = o->runs;
    event_set es;
    int rc = es.make((size_t)2 * runs, err);
    if (rc != MKV_OK)
        return rc;
    for (int i = 0; i < o->warmup; i++)
        MKV_CUDA_CHECK(cudaMemcpyAsync(i & 1 ? a.ptr : b.ptr, i & 1 ? b.ptr : a.ptr, bytes,
                                       cudaMemcpyDeviceToDevice, st));
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    spin<<<1, 1, 0, st>>>(spin_cycles(runs, 1, clock_khz));
    MKV_CUDA_CHECK_LAUNCH();
    for (int i = 0; i < runs; i++) {
        MKV_CUDA_CHECK(cudaEventRecord(es.ev[(size_t)2 * i], st));
        MKV_CUDA_CHECK(cudaMemcpyAsync(i & 1 ? a.ptr : b.ptr, i & 1 ? b.ptr : a.ptr, bytes,
                                       cudaMemcpyDeviceToDevice, st));
        MKV_CUDA_CHECK(cudaEventRecord(es.ev[(size_t)2 * i + 1], st));
    }
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<float> ms((size_t)runs);
    for (int i = 0; i < runs; i++)
        MKV_CUDA_CHECK(cudaEventElapsedTime(&ms[(size_t)i], es.ev[(size_t)2 * i], es.ev[(size_t)2 * i + 1]));
    *ms_out = quantile(ms, 0.5);
    *tbps = 2.0 * (double)bytes / (*ms_out * 1e-3) / 1e12;
    return MKV_OK;
}

/* --------------------------------------------------------------- output */

/* Bytes of one set's queries (the output has as many). */
static uint64_t q_bytes(const bench_case &c)
{
    return (uint64_t)c.shape.batch * c.shape.n_heads * c.shape.head_dim * sizeof(float);
}

static const char *TSV_HEADER =
    "impl\tbackend\tdtype\tbatch\tcontext\tn_heads\tn_kv_heads\thead_dim\tbudget\tn_sets\truns\t"
    "median_ms\tp10_ms\tp90_ms\tselect_ms\tbytes_read\tread_tbps\tcopy_tbps\tfrac_copy\t"
    "cache_bytes\tpeak_mem_bytes\tstatus\n";

struct row {
    std::string impl, backend, status;
    int batch = 0;
    int64_t context = 0;
    double budget = 1;
    int n_sets = 0, runs = 0;
    timing t;
    uint64_t bytes = 0, cache = 0, peak = 0;
};

static void print_row(FILE *f, const mkv_bench_opts *o, const row &r, double copy_tbps)
{
    const double ok = r.t.median > 0;
    const double tbps = ok ? (double)r.bytes / (r.t.median * 1e-3) / 1e12 : 0;
    fprintf(f, "%s\t%s\t%s\t%d\t%lld\t%d\t%d\t%d\t%g\t%d\t%d\t", r.impl.c_str(), r.backend.c_str(),
            o->is_bf16 ? "bf16" : "fp16", r.batch, (long long)r.context, o->n_heads, o->n_kv_heads, o->head_dim,
            r.budget, r.n_sets, r.runs);
    if (ok)
        fprintf(f, "%.5f\t%.5f\t%.5f\t", r.t.median, r.t.p10, r.t.p90);
    else
        fprintf(f, "NA\tNA\tNA\t");
    if (r.t.select_median >= 0)
        fprintf(f, "%.5f\t", r.t.select_median);
    else
        fprintf(f, "NA\t");
    fprintf(f, "%llu\t", (unsigned long long)r.bytes);
    if (ok)
        fprintf(f, "%.4f\t%.4f\t%.4f\t", tbps, copy_tbps, tbps / copy_tbps);
    else
        fprintf(f, "NA\t%.4f\tNA\t", copy_tbps);
    fprintf(f, "%llu\t%llu\t%s\n", (unsigned long long)r.cache, (unsigned long long)r.peak, r.status.c_str());
    fflush(f);
}

static std::vector<std::unique_ptr<bench_method>> methods_for(const mkv_bench_opts *o)
{
    std::vector<std::unique_ptr<bench_method>> ms;
    if (o->methods & MKV_BENCH_DENSE)
        ms.emplace_back(new dense_method(mkv_attn::ATTN_MINB));
    if (o->methods & MKV_BENCH_DENSE_VARIANT)
        ms.emplace_back(new dense_method(mkv_attn::ATTN_MINB == 3 ? 2 : 3));
    if (o->methods & MKV_BENCH_QUEST)
        for (int i = 0; i < o->n_budgets; i++) {
            mkv_quest_params qp = {};
            qp.page_size = o->page_size;
            qp.sink = o->sink;
            qp.recent = o->recent;
            qp.budget = o->budgets[i];
            ms.emplace_back(new quest_method(qp));
        }
    if (o->methods & MKV_BENCH_PACKED)
        for (int i = 0; i < o->n_budgets; i++)
            for (int j = 0; j < o->n_blockkey_bits; j++) {
                ms.emplace_back(new packed_method(o, o->budgets[i], false, o->blockkey_bits[j]));
                ms.emplace_back(new packed_method(o, o->budgets[i], true, o->blockkey_bits[j]));
            }
    return ms;
}

static int check_opts(const mkv_bench_opts *o, mkv_error *err)
{
    if (o->n_contexts < 1 || o->n_contexts > MKV_BENCH_MAX_LIST || o->n_batches < 1
        || o->n_batches > MKV_BENCH_MAX_LIST || o->n_budgets < 0 || o->n_budgets > MKV_BENCH_MAX_LIST)
        return mkv_fail(err, MKV_EUSAGE, "benchmark: 1..%d contexts and batches, 0..%d budgets",
                        MKV_BENCH_MAX_LIST, MKV_BENCH_MAX_LIST);
    if (o->runs < 1 || o->runs > 10000 || o->warmup < 0 || o->warmup > 10000)
        return mkv_fail(err, MKV_EUSAGE, "benchmark: runs %d (1..10000), warmup %d (0..10000)", o->runs,
                        o->warmup);
    if (!(o->mem_fraction > 0 && o->mem_fraction <= 1))
        return mkv_fail(err, MKV_EUSAGE, "benchmark: memory fraction %g not in (0, 1]", o->mem_fraction);
    for (int i = 0; i < o->n_contexts; i++)
        if (o->contexts[i] < 1 || o->contexts[i] > INT32_MAX)
            return mkv_fail(err, MKV_EUSAGE, "benchmark: context %lld out of range", (long long)o->contexts[i]);
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] < 1 || o->batches[i] > 4096)
            return mkv_fail(err, MKV_EUSAGE, "benchmark: batch %d out of range 1..4096", o->batches[i]);
    if ((o->methods & MKV_BENCH_PACKED)
        && (!(o->keep > 0 && o->keep <= 1) || o->dprime < 1 || o->dprime > o->head_dim || o->block < 1
            || o->block > 16 || (o->block & (o->block - 1)) || o->segment < o->block || o->sink < 0 || o->recent < 0))
        return mkv_fail(err, MKV_EUSAGE,
                        "benchmark: packed caches: keep %g in (0, 1], d' %d in 1..head_dim, block %d a power of two "
                        "up to 16, segment %d >= block",
                        o->keep, o->dprime, o->block, o->segment);
    if (o->n_blockkey_bits < 1 || o->n_blockkey_bits > 2)
        return mkv_fail(err, MKV_EUSAGE, "benchmark: %d block-key widths; 1 or 2", o->n_blockkey_bits);
    for (int i = 0; i < o->n_blockkey_bits; i++)
        if (o->blockkey_bits[i] != 16 && o->blockkey_bits[i] != 8)
            return mkv_fail(err, MKV_EUSAGE, "benchmark: block keys of %d bits; 16 or 8", o->blockkey_bits[i]);
    return MKV_OK;
}

/* Build the buffer sets of one configuration; MKV_ENOMEM when it does not fit. */
static int make_case(bench_case &c, const mkv_bench_opts *o, int batch, int64_t ctx, size_t l2, size_t budget_bytes,
                     cudaStream_t st, mkv_error *err)
{
    mkv_attn_shape &s = c.shape;
    s.batch = batch;
    s.n_heads = o->n_heads;
    s.n_kv_heads = o->n_kv_heads;
    s.head_dim = o->head_dim;
    s.t_max = ctx;
    s.is_bf16 = o->is_bf16;
    s.scale = 0;
    c.lengths.assign((size_t)batch, ctx);
    const size_t kv_elems = (size_t)batch * s.n_kv_heads * (size_t)ctx * s.head_dim;
    c.set_bytes = 2ull * kv_elems * 2;
    /* Enough sets that together they are 4x the L2 (one set when it alone is). */
    uint64_t sets = (4ull * l2 + c.set_bytes - 1) / c.set_bytes;
    sets = sets < 1 ? 1 : sets > 8 ? 8 : sets;
    /* Quest metadata is 1/16 of K+V at page 16; keep a margin for plans. */
    const uint64_t per_set = c.set_bytes + c.set_bytes / 8;
    if (sets * per_set + (256ull << 20) > budget_bytes)
        return mkv_fail(err, MKV_ENOMEM, "needs %.1f GiB of device memory, %.1f GiB allowed",
                        (double)(sets * per_set + (256ull << 20)) / (1 << 30), (double)budget_bytes / (1 << 30));
    c.n_sets = (int)sets;
    const size_t q_elems = (size_t)batch * s.n_heads * s.head_dim;
    int rc;
    void *p = nullptr;
    for (int i = 0; i < c.n_sets; i++) {
        if ((rc = c.alloc(&p, kv_elems * 2, err)) != MKV_OK)
            return rc;
        c.k.push_back((uint16_t *)p);
        if ((rc = c.alloc(&p, kv_elems * 2, err)) != MKV_OK)
            return rc;
        c.v.push_back((uint16_t *)p);
        if ((rc = c.alloc(&p, q_elems * sizeof(float), err)) != MKV_OK)
            return rc;
        c.q.push_back((float *)p);
        const uint64_t seed = o->seed * 1000003u + (uint64_t)batch * 7919u + (uint64_t)ctx * 31u + (uint64_t)i * 3u;
        fill_16<<<fill_blocks(kv_elems), 256, 0, st>>>(c.k.back(), kv_elems, seed, s.is_bf16);
        fill_16<<<fill_blocks(kv_elems), 256, 0, st>>>(c.v.back(), kv_elems, seed + 1, s.is_bf16);
        fill_f32<<<fill_blocks(q_elems), 256, 0, st>>>(c.q.back(), q_elems, seed + 2);
        MKV_CUDA_CHECK_LAUNCH();
    }
    if ((rc = c.alloc(&p, q_elems * sizeof(float), err)) != MKV_OK)
        return rc;
    c.out = (float *)p;
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    return MKV_OK;
}

static int outputs_finite(const bench_case &c, cudaStream_t st, bool *finite, mkv_error *err)
{
    mkv_device_buffer bad;
    MKV_CUDA_CHECK(bad.alloc(sizeof(unsigned)));
    MKV_CUDA_CHECK(cudaMemsetAsync(bad.ptr, 0, sizeof(unsigned), st));
    const size_t n = (size_t)c.shape.batch * c.shape.n_heads * c.shape.head_dim;
    count_nonfinite<<<fill_blocks(n), 256, 0, st>>>(c.out, n, bad.as<unsigned>());
    MKV_CUDA_CHECK_LAUNCH();
    unsigned h = 0;
    MKV_CUDA_CHECK(cudaMemcpyAsync(&h, bad.ptr, sizeof h, cudaMemcpyDeviceToHost, st));
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    *finite = h == 0;
    return MKV_OK;
}

struct stream_holder {
    cudaStream_t s = nullptr;
    ~stream_holder()
    {
        if (s)
            (void)cudaStreamDestroy(s);
    }
};

}  // namespace

extern "C" int mkv_bench_attention(const mkv_bench_opts *o, FILE *tsv, FILE *log, mkv_error *err)
{
    if (o == NULL || tsv == NULL)
        return mkv_fail(err, MKV_EUSAGE, "benchmark: NULL options or output");
    int rc = check_opts(o, err);
    if (rc != MKV_OK)
        return rc;
    int dev = 0, clock_khz = 0, l2 = 0;
    cudaDeviceProp prop;
    MKV_CUDA_CHECK(cudaGetDevice(&dev));
    MKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
    l2 = prop.l2CacheSize;
    stream_holder sh;
    MKV_CUDA_CHECK(cudaStreamCreateWithFlags(&sh.s, cudaStreamNonBlocking));
    cudaStream_t st = sh.s;

    double copy_tbps = 0, copy_ms = 0;
    if ((rc = measure_copy(o, st, clock_khz, &copy_tbps, &copy_ms, err)) != MKV_OK)
        return rc;
    if (log)
        fprintf(log, "bench: %s, %d SMs, L2 %d MiB; device-to-device copy %.3f TB/s (read + write)\n", prop.name,
                prop.multiProcessorCount, l2 >> 20, copy_tbps);
    fputs(TSV_HEADER, tsv);
    {
        row r;
        r.impl = "copy";
        r.backend = "cudaMemcpy";
        r.n_sets = 1;
        r.runs = o->runs;
        r.t.median = r.t.p10 = r.t.p90 = copy_ms;
        r.bytes = 2ull << 30;   /* read + write, so read_tbps is the copy figure */
        r.status = "ok: 1 GiB device-to-device; bytes_read counts read + write";
        print_row(tsv, o, r, copy_tbps);
    }

    int ran = 0;
    mkv_error skipped = {};
    for (int ci = 0; ci < o->n_contexts; ci++)
        for (int bi = 0; bi < o->n_batches; bi++) {
            const int batch = o->batches[bi];
            const int64_t ctx = o->contexts[ci];
            size_t free_b = 0, total_b = 0;
            MKV_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            std::vector<std::unique_ptr<bench_method>> methods = methods_for(o);
            std::unique_ptr<bench_case> c(new (std::nothrow) bench_case);
            if (!c)
                return mkv_fail(err, MKV_ENOMEM, "benchmark: out of host memory");
            mkv_error cerr = {};
            rc = make_case(*c, o, batch, ctx, (size_t)l2, (size_t)(o->mem_fraction * (double)free_b), st, &cerr);
            if (rc == MKV_ENOMEM) {
                for (auto &m : methods) {
                    row r;
                    r.impl = m->impl();
                    r.backend = m->backend();
                    r.batch = batch;
                    r.context = ctx;
                    r.budget = m->budget();
                    r.status = std::string("skipped: ") + cerr.msg;
                    print_row(tsv, o, r, copy_tbps);
                }
                if (log)
                    fprintf(log, "bench: batch %d x %lld tokens skipped: %s\n", batch, (long long)ctx, cerr.msg);
                if (!skipped.code)
                    mkv_fail(&skipped, MKV_ENOMEM, "batch %d x %lld tokens: %s", batch, (long long)ctx, cerr.msg);
                continue;
            }
            if (rc != MKV_OK) {
                if (err)
                    *err = cerr;
                return rc;
            }
            ran++;
            for (auto &m : methods) {
                row r;
                r.impl = m->impl();
                r.backend = m->backend();
                r.batch = batch;
                r.context = ctx;
                r.budget = m->budget();
                r.n_sets = c->n_sets;
                r.runs = o->runs;
                mkv_error merr = {};
                rc = m->setup(*c, &merr);
                const uint64_t held = mkv_device_bytes_now();
                mkv_device_bytes_reset_peak();
                if (rc == MKV_OK)
                    rc = time_method(*m, *c, o, st, clock_khz, &r.t, &merr);
                const uint64_t during = mkv_device_bytes_peak() - held;   /* allocated while it ran */
                bool finite = false;
                if (rc == MKV_OK)
                    rc = outputs_finite(*c, st, &finite, &merr);
                if (rc == MKV_EGPU) {   /* a fault poisons the context: stop here */
                    if (err)
                        *err = merr;
                    return rc;
                }
                r.bytes = m->bytes_read(*c);
                r.cache = m->cache_bytes(*c);
                r.peak = r.cache + 2 * q_bytes(*c) + m->plan_bytes + during;
                if (rc != MKV_OK) {
                    r.t = timing();
                    r.status = std::string("error: ") + merr.msg;
                } else {
                    r.status = finite ? "ok" : "error: non-finite outputs";
                }
                print_row(tsv, o, r, copy_tbps);
                if (log)
                    fprintf(log, "bench: %-5s %-9s batch %d x %7lld tokens budget %-6g %8.4f ms  %s\n", r.impl.c_str(),
                            r.backend.c_str(), batch, (long long)ctx, r.budget, r.t.median, r.status.c_str());
                m.reset();   /* free its plan and buffers before the next method */
            }
        }
    /* some cases may not fit; none fitting is an error, not an empty table */
    if (!ran && skipped.code)
        return mkv_fail(err, MKV_ENOMEM, "benchmark: no case fits the device (%s)", skipped.msg);
    return MKV_OK;
}
