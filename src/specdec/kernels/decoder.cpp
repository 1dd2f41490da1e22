// specdec's own forward of a Llama-family decoder (Llama, Qwen2, SmolLM2) over n rows in one
// call: embedding lookup, then per layer RMSNorm, q/k/v (+ bias; Qwen3: an RMSNorm per q and k
// head), rotary (angles from the caller's tables: Llama 3's divided frequencies), K/V written into a
// static cache by slot, attention, o, residual, RMSNorm, gate/up, SiLU * up, down, residual;
// then the final norm and the output layer, float32 logits. The linear layers are qgemm.cpp's
// kernels (included below: the same tiles, the same bits as specdec.kernels.linear).
//
// Why a row's logits cannot depend on the block it is computed in: every step is computed per
// row from that row alone (norms, rotary, SiLU; the kernels quantize each row by itself), and a
// row's attention runs over exactly the cache slots it sees, in the order given, with the same
// float operations whatever the other rows are; the threads split whole rows, or attention's
// (row, query head) pairs grouped by the K/V head they read, so the split cannot change a value.
// A tree row that sees the slots of its ancestors therefore gets the bits of the chain row at
// the same position.
//
// Activations are float32 throughout; the cache holds keys (after rotary) and values as IEEE
// half floats (binary16, llama.cpp's default cache: half the bytes a long context's attention
// reads), each rounded once to nearest-even when stored, [kv_heads][capacity][head_dim] per
// layer, a slot per cached position: each K/V head's keys lie in one run, which attention
// streams (slot-major rows, half of each read for one head, left the hardware prefetchers
// behind).
#include "qgemm.cpp"

#include <omp.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>

// One quantized linear weight in the kernels' tile layout (kernels.Packed), N outputs, K inputs.
struct SdWeight {
    int32_t bits, zero;
    int64_t per_super, K, N;
    const uint8_t* codes;
    const void* subs;
    const float* supers;
    const float* bias;  // N float32 or null
};

// Layers fed the same input (q/k/v, gate/up): one stacked weight where their forms agree, else
// one weight each; their outputs lie side by side in one row.
struct SdParts {
    SdWeight part[3];
    int64_t count;
};

struct SdLayer {
    SdParts qkv, gate_up;
    SdWeight o, down;
    const float *attn_norm, *mlp_norm;
    uint16_t *k_cache, *v_cache;  // binary16 (Kv)
    const float *q_norm, *k_norm;  // [head_dim] each, or null (no per-head norm)
};

struct SdModel {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, capacity;
    float eps, attn_scale;
    const float* final_norm;
    const float *cos, *sin;  // [capacity][head_dim / 2]: rotary angles by position
    const SdLayer* layer;
    SdWeight head;
};

// Which cache slots a row sees: its sequence's positions j < prefix[r], position j at slot
// shared[r] + j below split[r] (a prefix read from a run other sequences read too) and at
// lo[r] + j from there (its own run), then extra[start[r] .. start[r+1]).
struct SdVisible {
    const int64_t *lo, *prefix, *start, *extra, *split, *shared;
};

namespace {

constexpr int kLanes = 16;  // a dot product's fixed partial sums (vectorised by the compiler)

// y = x W^T (+ bias) for one weight; the rows are quantized once per call (qgemm's linear).
template <int Bits>
void apply_low(const SdWeight& w, const float* x, int64_t rows, float* out) {
    linear(QLow<Bits>{w.codes, static_cast<const uint8_t*>(w.subs), w.supers, w.per_super}, x, 0, rows, w.K, w.N, 0,
           w.bias, out, 0, 0);
}

// As apply_low for Q6 and Q8 (groups of 16 around a zero).
template <int Bits>
void apply_high(const SdWeight& w, const float* x, int64_t rows, float* out) {
    linear(QHigh<Bits>{w.codes, static_cast<const int8_t*>(w.subs), w.supers, w.zero, w.per_super}, x, 0, rows, w.K,
           w.N, w.zero, w.bias, out, 0, 0);
}

void apply(const SdWeight& w, const float* x, int64_t rows, float* out) {
    if (w.bits == 4) return apply_low<4>(w, x, rows, out);
    if (w.bits == 3) return apply_low<3>(w, x, rows, out);
    if (w.bits == 5) return apply_low<5>(w, x, rows, out);
    if (w.bits == 6) return apply_high<6>(w, x, rows, out);
    apply_high<8>(w, x, rows, out);
}

thread_local std::vector<float> part_out;

// The parts' outputs side by side in out [rows, sum of N].
void apply_parts(const SdParts& p, const float* x, int64_t rows, float* out) {
    if (p.count == 1) return apply(p.part[0], x, rows, out);
    int64_t width = 0, at = 0;
    for (int64_t i = 0; i < p.count; ++i) width += p.part[i].N;
    for (int64_t i = 0; i < p.count; ++i) {
        const int64_t n = p.part[i].N;
        part_out.resize(rows * n);
        apply(p.part[i], x, rows, part_out.data());
        for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * width + at, &part_out[r * n], n * sizeof(float));
        at += n;
    }
}

// 16 floats as one value: lane-wise + and * are the scalar float operations of each lane, so
// code on it computes dot()'s partial sums (and its bits) with the accumulators in registers.
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load(const float* p) {
    Lanes v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

typedef float Half __attribute__((vector_size(kLanes / 2 * sizeof(float))));
typedef float Quarter __attribute__((vector_size(kLanes / 4 * sizeof(float))));
typedef float Eighth __attribute__((vector_size(kLanes / 8 * sizeof(float))));

// A K/V cache element: IEEE binary16 bits.
typedef uint16_t Kv;

// f rounded to binary16, to nearest-even, as F16C's vcvtps2ph does it: past 65504 and half an
// ulp is infinity, below 2^-14 a subnormal, a NaN a quiet NaN keeping its payload's top bits.
inline Kv half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) return Kv(sign | 0x7E00 | ((ax >> 13) & 0x3FF));
    if (ax >= 0x477FF000) return Kv(sign | 0x7C00);
    if (ax < 0x38800000) {  // m * 2^-24: the product by 2^24 is exact, nearbyint rounds to even
        float a;
        std::memcpy(&a, &ax, sizeof a);
        return Kv(sign | uint32_t(std::nearbyint(a * 16777216.f)));
    }
    return Kv(sign | ((ax + 0xFFF + ((ax >> 13) & 1) - 0x38000000) >> 13));
}

// A binary16 value as a float (every one is exactly a float).
inline float half_value(Kv h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) return (sign ? -1.f : 1.f) * (float(m) * 0x1p-24f);
    const uint32_t bits = sign | (e == 31 ? 0x7F800000 | (m << 13) : ((e + 112) << 23) | (m << 13));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// n floats (a multiple of kLanes) into the cache's binary16, by the CPU's conversion where it has
// one (F16C; the same bits as half_bits).
inline void store_half(Kv* p, const float* x, int64_t n) {
#if defined(__AVX512F__)
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256((__m256i*)(p + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i*)(p + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    for (int64_t i = 0; i < n; ++i) p[i] = half_bits(x[i]);
#endif
}

// kLanes cache values as floats.
inline Lanes load_half(const Kv* p) {
#if defined(__AVX512F__)
    return Lanes(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)));
#elif defined(__F16C__)
    const Half lo = Half(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)));
    const Half hi = Half(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8))));
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    Lanes v;
    for (int i = 0; i < kLanes; ++i) v[i] = half_value(p[i]);
    return v;
#endif
}

// The lower and upper halves of a vector as vectors.
template <typename Part, typename Whole>
inline void halves(Whole v, Part& lo, Part& hi) {
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
}

// a * b + c lane by lane, rounded once: one FMA instruction where the CPU has them (the build's
// -ffp-contract=off keeps a written a * b + c two roundings, and attention's products and sums
// were two instructions each), std::fma's same bits elsewhere.
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
#if defined(__AVX512F__)
    return Lanes(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c)));
#elif defined(__AVX2__) && defined(__FMA__)
    Half al, ah, bl, bh, cl, ch;
    halves(a, al, ah), halves(b, bl, bh), halves(c, cl, ch);
    const Half lo = Half(_mm256_fmadd_ps(__m256(al), __m256(bl), __m256(cl)));
    const Half hi = Half(_mm256_fmadd_ps(__m256(ah), __m256(bh), __m256(ch)));
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    Lanes r;
    for (int i = 0; i < kLanes; ++i) r[i] = std::fma(a[i], b[i], c[i]);
    return r;
#endif
}

// v kept in a register: GCC otherwise folds a load that several FMAs use into each of them as a
// memory operand, so a key or value was read once per head (a load per FMA, the load ports' limit).
inline Lanes held(Lanes v) {
#if defined(__AVX512F__)
    __asm__("" : "+v"(v));
#endif
    return v;
}

// x in every lane (one broadcast; a loop storing lane by lane compiled to 16 masked ones).
inline Lanes splat(float x) {
    static_assert(kLanes == 16);
    return Lanes{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

// The kLanes partial sums added in one fixed order: halves added lane-wise, in registers.
inline float reduce(Lanes v) {
    Half a, b;
    halves(v, a, b);
    Quarter c, d;
    halves(a + b, c, d);
    Eighth e, f;
    halves(c + d, e, f);
    const Eighth g = e + f;
    return g[0] + g[1];
}

// A dot product over n (a multiple of kLanes) in kLanes fixed partial sums.
inline float dot(const float* a, const float* b, int64_t n) {
    Lanes acc = {};
    for (int64_t d = 0; d < n; d += kLanes) acc = acc + load(a + d) * load(b + d);
    return reduce(acc);
}

// HF's LlamaRMSNorm in float32: w * (x * rsqrt(mean(x^2) + eps)).
void rms_norm(const float* x, const float* w, int64_t rows, int64_t H, float eps, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float* v = x + r * H;
        const float inv = 1.f / std::sqrt(dot(v, v, H) / float(H) + eps);
        for (int64_t i = 0; i < H; ++i) out[r * H + i] = w[i] * (v[i] * inv);
    }
}

// HF's rotate_half layout: the pairs are (i, i + D/2); x*cos + rotate_half(x)*sin.
inline void rotate(float* x, const float* c, const float* s, int64_t D) {
    const int64_t h = D / 2;
    for (int64_t i = 0; i < h; ++i) {
        const float a = x[i], b = x[i + h];
        x[i] = a * c[i] - b * s[i];
        x[i + h] = b * c[i] + a * s[i];
    }
}

// The per-head RMSNorm of q or k in place (one head of D values).
inline void head_norm(float* x, const float* w, int64_t D, float eps) {
    const float inv = 1.f / std::sqrt(dot(x, x, D) / float(D) + eps);
    for (int64_t i = 0; i < D; ++i) x[i] = w[i] * (x[i] * inv);
}

// Rotary on q and k of each row (after their per-head norms, where the model has them), then k
// and v into the cache at the row's slot.
void rope_and_store(const SdModel& m, const SdLayer& L, float* qkv, int64_t rows, const int64_t* positions,
                    const int64_t* slots) {
    const int64_t D = m.head_dim, width = (m.heads + 2 * m.kv_heads) * D;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        float* row = qkv + r * width;
        const float* c = m.cos + positions[r] * (D / 2);
        const float* s = m.sin + positions[r] * (D / 2);
        if (L.q_norm) {
            for (int64_t h = 0; h < m.heads; ++h) head_norm(row + h * D, L.q_norm, D, m.eps);
            for (int64_t h = m.heads; h < m.heads + m.kv_heads; ++h) head_norm(row + h * D, L.k_norm, D, m.eps);
        }
        for (int64_t h = 0; h < m.heads + m.kv_heads; ++h) rotate(row + h * D, c, s, D);
        for (int64_t h = 0; h < m.kv_heads; ++h) {
            const int64_t at = (h * m.capacity + slots[r]) * D;
            store_half(L.k_cache + at, row + (m.heads + h) * D, D);
            store_half(L.v_cache + at, row + (m.heads + m.kv_heads + h) * D, D);
        }
    }
}

// The slots one row sees, in order: positions [0, prefix) (below split in the shared run, then
// in its own), then its extras. Attention walks keys by this order j, whatever run holds them,
// so a row over a shared prefix does the float operations of one over a single run.
struct Seen {
    int64_t lo, prefix, count, split, shared;
    const int64_t* extra;
    int64_t slot(int64_t j) const { return j < prefix ? (j < split ? shared : lo) + j : extra[j - prefix]; }
};

inline Seen seen(const SdVisible& vis, int64_t r) {
    return {vis.lo[r], vis.prefix[r], vis.prefix[r] + vis.start[r + 1] - vis.start[r], vis.split[r], vis.shared[r],
            vis.extra + vis.start[r]};
}

constexpr int64_t kKeyRun = 16;  // keys whose scores with one query head are computed and reduced together
constexpr int64_t kKeyBlock = 64;  // keys whose values stay in L1 while a head sums them

// acc[i] = the kLanes partial sums of q with key k[i] (an FMA a step) for the 16 keys of a run.
inline void run_dots(const float* q, const Kv* const* k, int64_t D, Lanes* acc) {
    for (int i = 0; i < kKeyRun; ++i) acc[i] = Lanes{};
    for (int64_t d = 0; d < D; d += kLanes) {
        const Lanes x = load(q + d);
        for (int i = 0; i < kKeyRun; ++i) acc[i] = fma(x, load_half(k[i] + d), acc[i]);
    }
}

// run_dots for two query heads and 8 keys: acc[i] for qa with key k[i], acc[8 + i] for qb, each
// key's load serving both heads (one head alone loads a key for every FMA); each sum's FMAs are
// run_dots's own, in its order.
inline void run_dots_2(const float* qa, const float* qb, const Kv* const* k, int64_t D, Lanes* acc) {
    for (int i = 0; i < kKeyRun; ++i) acc[i] = Lanes{};
    for (int64_t d = 0; d < D; d += kLanes) {
        const Lanes xa = load(qa + d), xb = load(qb + d);
        for (int i = 0; i < kKeyRun / 2; ++i) {
            const Lanes key = held(load_half(k[i] + d));
            acc[i] = fma(xa, key, acc[i]);
            acc[kKeyRun / 2 + i] = fma(xb, key, acc[kKeyRun / 2 + i]);
        }
    }
}

// Lane i = reduce(acc[i]) for 16 accumulators: the same additions in reduce()'s order (halves,
// quarters, eighths, the last pair), two vectors' partial sums side by side in each step, where
// reduce() alone spends as many shuffles and adds on one.
inline Lanes reduce_run(const Lanes* acc) {
    Lanes b[8], c[4], d[2];
    for (int i = 0; i < 8; ++i)
        b[i] = __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; ++i)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; ++i)
        d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

thread_local std::vector<Seen> tile_rows;
thread_local std::vector<float> scores, tops, totals;

// exp(a) for a <= 0: exp(r) * 2^n with n = round(a / ln 2), |r| <= ln 2 / 2, exp(r) by its Taylor
// polynomial to r^6 (relative error at most 2.5e-7 over [-87, 0], measured). Plain float
// arithmetic with no branch or library call, so the compiler vectorises its loops and every
// element gets the same bits in any lane; arguments below -87 give exp(-87) (1.6e-38), exp(0) = 1.
inline float exp_nonpositive(float a) {
    const float log2e = 1.44269504f, ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f, round = 12582912.f;
    a = std::max(a, -87.f);
    const float k = (a * log2e + round) - round;  // round to nearest, as an integral float
    const float r = (a - k * ln2_hi) - k * ln2_lo;
    float p = 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// x[j] = exp(x[j] - top) for x[j] <= top (a softmax's weights: below -87, nothing next to the
// largest's 1).
void exp_shifted(float* x, int64_t n, float top) {
    for (int64_t j = 0; j < n; ++j) x[j] = exp_nonpositive(x[j] - top);
}

// o[h][0 .. V * kLanes) += w[h][j] * value j's same outputs for the keys j0 .. j1 of a row, in
// that order, for H heads of one K/V group (values: the group's value of slot 0 at the first of
// those outputs, D floats a slot). V x H accumulators side by side: each add waits on the one
// before it in its output's sum, so it takes about 16 independent sums to keep the CPU's adders
// busy (2 left a prefill's weighted sums latency-bound), and the heads share each value's load.
template <int V, int H>
inline void add_weighted(float* const* o, const float* const* w, const Kv* values, int64_t D, const Seen& row,
                         int64_t j0, int64_t j1) {
    Lanes acc[H][V];
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < V; ++i) acc[h][i] = load(o[h] + i * kLanes);
    for (int64_t j = j0; j < j1; ++j) {
        const Kv* v = values + row.slot(j) * D;
        for (int i = 0; i < V; ++i) {
            const Lanes value = held(load_half(v + i * kLanes));
            for (int h = 0; h < H; ++h) acc[h][i] = fma(splat(w[h][j]), value, acc[h][i]);
        }
    }
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < V; ++i) store(o[h] + i * kLanes, acc[h][i]);
}

// add_weighted for n <= H heads (a group's last few), the head count a template argument.
template <int V, int H>
inline void add_weighted_heads(int n, float* const* o, const float* const* w, const Kv* values, int64_t D,
                               const Seen& row, int64_t j0, int64_t j1) {
    if (n == H) return add_weighted<V, H>(o, w, values, D, row, j0, j1);
    if constexpr (H > 1) add_weighted_heads<V, H - 1>(n, o, w, values, D, row, j0, j1);
}

// A row's weighted values over keys j0 .. j1 for heads [h0, h1): outputs V * kLanes at a time,
// heads 16 / V at a time (o: the row's first head's output, D floats a head; w: its weights,
// `stride` floats a head).
template <int V>
void weighted_values(float* o, const float* w, int64_t stride, int64_t nh, const Kv* values, int64_t D,
                     const Seen& row, int64_t j0, int64_t j1) {
    constexpr int H = 16 / V;
    for (int64_t c = 0; c < D; c += V * kLanes)
        for (int64_t h = 0; h < nh; h += H) {
            const int n = int(std::min<int64_t>(H, nh - h));
            float* os[H];
            const float* ws[H];
            for (int i = 0; i < n; ++i) os[i] = o + (h + i) * D + c, ws[i] = w + (h + i) * stride;
            add_weighted_heads<V, H>(n, os, ws, values + c, D, row, j0, j1);
        }
}

// Softmax totals of a row's heads: totals[h] = p[h][0] + p[h][1] + ... + p[h][count - 1] in
// that order, four heads' sums side by side (one alone is an add's latency per key).
void sum_weights(const float* p, int64_t stride, int64_t nh, int64_t count, float* totals) {
    constexpr int kChains = 4;
    for (int64_t h = 0; h < nh; h += kChains) {
        const float* q[kChains];
        for (int i = 0; i < kChains; ++i) q[i] = p + std::min(h + i, nh - 1) * stride;  // past nh: repeats, unused
        float t[kChains] = {};
        for (int64_t j = 0; j < count; ++j)
            for (int i = 0; i < kChains; ++i) t[i] = t[i] + q[i][j];
        for (int i = 0; i < kChains && h + i < nh; ++i) totals[h + i] = t[i];
    }
}

// Rows [r0, r1) and query heads [h0, h1), all of K/V head kvh, each (row, head) over the slots
// its row sees: scores and their running max key by key, then the weights exp(score - max) and
// their sum, then the weighted values key by key. Each (row, head) runs exactly the float
// operations it would alone, in the same order; the tile only shares the reads of each key and
// value among the heads of a group (GQA) and the rows of a block, which otherwise re-read the
// whole cache once per (row, query head).
void attend_tile(const SdModel& m, const SdLayer& L, const float* qkv, int64_t r0, int64_t r1, int64_t h0,
                 int64_t h1, int64_t kvh, const SdVisible& vis, float* out) {
    const int64_t D = m.head_dim, width = (m.heads + 2 * m.kv_heads) * D, nh = h1 - h0, pairs = (r1 - r0) * nh;
    const Kv *keys = L.k_cache + kvh * m.capacity * D, *values = L.v_cache + kvh * m.capacity * D;
    tile_rows.resize(r1 - r0);
    int64_t most = 0;
    for (int64_t r = r0; r < r1; ++r) {
        tile_rows[r - r0] = seen(vis, r);
        most = std::max(most, tile_rows[r - r0].count);
    }
    // A (row, head)'s scores, `stride` floats apart: room for a whole last run of kKeyRun.
    const int64_t stride = (most + kKeyRun - 1) / kKeyRun * kKeyRun;
    scores.resize(pairs * stride);
    tops.assign(pairs * kLanes, -INFINITY);
    totals.resize(pairs);
    // Plain pointers: a thread_local's every use in a shared library may be a call.
    float *score_at = scores.data(), *top = tops.data(), *total_at = totals.data();
    const Seen* seen_at = tile_rows.data();
    // Scores a run of kKeyRun keys at a time: the run's keys stay in L1 for every row and head of
    // the tile, and one reduce_run gives a (row, head) its run's 16 scores.
    for (int64_t j0 = 0; j0 < most; j0 += kKeyRun) {
        bool prefetched = false;
        for (int64_t r = r0; r < r1; ++r) {
            const Seen& row = seen_at[r - r0];
            if (j0 >= row.count) continue;
            const int64_t n = std::min(kKeyRun, row.count - j0);
            const Kv* k[kKeyRun];
            // past n: key j0 again, scored and stored past the row's count (unused), its max a
            // score the run already has
            for (int64_t i = 0; i < kKeyRun; ++i) k[i] = keys + row.slot(j0 + (i < n ? i : 0)) * D;
            // The CPU's own prefetchers start too late on these streams: the next run's keys into
            // L1, their values into L2 for the weighted sums that follow the scores (once a run:
            // a tile's rows share their keys but for a tree's own nodes).
            for (int64_t j = j0 + kKeyRun; !prefetched && j < std::min(row.count, j0 + 2 * kKeyRun); ++j)
                for (int64_t d = 0; d < D; d += 64 / sizeof(Kv)) {  // a line at a time
                    __builtin_prefetch(keys + row.slot(j) * D + d);
                    __builtin_prefetch(values + row.slot(j) * D + d, 0, 2);
                }
            prefetched = true;
            const auto keep = [&](int64_t h, Lanes got) {
                const int64_t pair = (r - r0) * nh + (h - h0);
                store(score_at + pair * stride + j0, got);
                // Each lane's running max: a NaN score never replaces it (as fmax), and which of
                // +0 and -0 stays changes no weight exp(score - max)
                const Lanes best = load(top + pair * kLanes);
                store(top + pair * kLanes, got > best ? got : best);
            };
            const float* q = qkv + r * width;
            int64_t h = h0;
            for (; h + 1 < h1; h += 2) {  // two heads at a time, a run's keys in halves of 8
                Lanes acc[kKeyRun];
                run_dots_2(q + h * D, q + (h + 1) * D, k, D, acc);
                const Lanes first = reduce_run(acc);  // keys 0-7 of head h, then of h + 1
                run_dots_2(q + h * D, q + (h + 1) * D, k + kKeyRun / 2, D, acc);
                const Lanes second = reduce_run(acc);
                keep(h, __builtin_shufflevector(first, second, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) * m.attn_scale);
                keep(h + 1, __builtin_shufflevector(first, second, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31) * m.attn_scale);
            }
            if (h < h1) {
                Lanes acc[kKeyRun];
                run_dots(q + h * D, k, D, acc);
                keep(h, reduce_run(acc) * m.attn_scale);
            }
        }
    }
    // Softmax weights of each (row, head), key by key, in place of its scores, and their sums.
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t count = seen_at[r - r0].count;
        for (int64_t h = h0; h < h1; ++h) {
            const int64_t pair = (r - r0) * nh + (h - h0);
            float most_of = -INFINITY;
            for (int i = 0; i < kLanes; ++i) most_of = top[pair * kLanes + i] > most_of ? top[pair * kLanes + i] : most_of;
            exp_shifted(score_at + pair * stride, count, most_of);
            std::fill_n(out + (r * m.heads + h) * D, D, 0.f);
        }
        sum_weights(score_at + (r - r0) * nh * stride, stride, nh, count, total_at + (r - r0) * nh);
    }
    // o += weight * value key by key; a block of keys at a time, up to 128 of a head's outputs
    // held in registers over the block (each output still sums its keys in ascending order).
    for (int64_t j0 = 0; j0 < most; j0 += kKeyBlock)
        for (int64_t r = r0; r < r1; ++r) {
            const Seen& row = seen_at[r - r0];
            const int64_t j1 = std::min(j0 + kKeyBlock, row.count);
            if (j0 >= j1) continue;
            float* o = out + (r * m.heads + h0) * D;
            const float* w = score_at + (r - r0) * nh * stride;
            if (D % (8 * kLanes) == 0)
                weighted_values<8>(o, w, stride, nh, values, D, row, j0, j1);
            else if (D % (4 * kLanes) == 0)
                weighted_values<4>(o, w, stride, nh, values, D, row, j0, j1);
            else
                weighted_values<2>(o, w, stride, nh, values, D, row, j0, j1);
        }
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t h = h0; h < h1; ++h) {
            float* o = out + (r * m.heads + h) * D;
            const float total = total_at[(r - r0) * nh + (h - h0)];
            for (int64_t d = 0; d < D; ++d) o[d] = o[d] / total;
        }
}

constexpr int64_t kAttendRows = 16;  // rows sharing each key read; their scores stay in L2 up to ~2K keys

// Tasks of (row tile, K/V head, share of its query heads), as many as the threads where the
// rows allow: a decode row alone splits its groups' heads; a prefill tiles its rows.
void attention(const SdModel& m, const SdLayer& L, const float* qkv, int64_t rows, const SdVisible& vis,
               float* out) {
    const int64_t threads = omp_get_max_threads(), group = m.heads / m.kv_heads;
    const int64_t tile = std::clamp<int64_t>(rows * m.kv_heads / threads, 1, kAttendRows);
    const int64_t tiles = (rows + tile - 1) / tile;
    const int64_t shares = std::clamp<int64_t>((threads + tiles * m.kv_heads - 1) / (tiles * m.kv_heads), 1, group);
    const int64_t tasks = tiles * m.kv_heads * shares;
#pragma omp parallel for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t t = task / (m.kv_heads * shares), kvh = task / shares % m.kv_heads, share = task % shares;
        const int64_t h0 = kvh * group + share * group / shares, h1 = kvh * group + (share + 1) * group / shares;
        attend_tile(m, L, qkv, t * tile, std::min(rows, (t + 1) * tile), h0, h1, kvh, vis, out);
    }
}

// silu(gate) * up per element, gate and up side by side in each row of gu: sigmoid(g) from
// e = exp(-|g|) <= 1 as 1 / (1 + e) or e / (1 + e), so the polynomial exp serves and the loop
// vectorises (a library exp per element was a fifth of the 0.5B draft's non-kernel time).
void silu_mul(const float* gu, int64_t rows, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gate = gu + r * 2 * I, *up = gate + I;
        float* o = out + r * I;
        for (int64_t i = 0; i < I; ++i) {
            const float g = gate[i], e = exp_nonpositive(-std::fabs(g));
            o[i] = g * ((g >= 0.f ? 1.f : e) / (1.f + e)) * up[i];
        }
    }
}

void add(float* x, const float* y, int64_t count) {
    for (int64_t i = 0; i < count; ++i) x[i] = x[i] + y[i];
}

// Seconds spent per stage since the last read (sd_decoder_timings), for profiles of a step:
// a clock read per stage and layer, about 20 ns each.
enum Stage { kNorm, kQkv, kRope, kAttention, kO, kGateUp, kSilu, kDown, kHead, kStages };
double stage_seconds[kStages];

struct Clock {
    std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
    void lap(Stage stage) {
        const auto now = std::chrono::steady_clock::now();
        stage_seconds[stage] += std::chrono::duration<double>(now - last).count();
        last = now;
    }
};

struct Scratch {
    std::vector<float> x, h, qkv, attn, gu, act, y;
};
Scratch scratch;

}  // namespace

extern "C" {

// Forward n rows: embedded[r] (the token's embedding row, [n, hidden] float32: the caller decodes
// the rows of a quantized table) at rotary position positions[r], its K/V written to slot
// slots[r], seeing `vis`; logits [wanted_n, head N] for rows wanted[0 .. wanted_n). The rows may
// belong to several sequences (each its own run of slots): every row is computed as it would be
// alone. The caller checks shapes and that every slot and position lies below the capacity.
void sd_decoder_forward(const SdModel* model, const float* embedded, int64_t n, const int64_t* positions,
                        const int64_t* slots, SdVisible vis, const int64_t* wanted, int64_t wanted_n,
                        float* logits) {
    const SdModel& m = *model;
    const int64_t H = m.hidden, D = m.head_dim;
    Scratch& s = scratch;
    s.x.resize(n * H);
    s.h.resize(n * H);
    s.qkv.resize(n * (m.heads + 2 * m.kv_heads) * D);
    s.attn.resize(n * m.heads * D);
    s.gu.resize(n * 2 * m.inter);
    s.act.resize(n * m.inter);
    s.y.resize(n * H);
    Clock clock;
    std::memcpy(s.x.data(), embedded, n * H * sizeof(float));
    for (int64_t i = 0; i < m.layers; ++i) {
        const SdLayer& L = m.layer[i];
        rms_norm(s.x.data(), L.attn_norm, n, H, m.eps, s.h.data());
        clock.lap(kNorm);
        apply_parts(L.qkv, s.h.data(), n, s.qkv.data());
        clock.lap(kQkv);
        rope_and_store(m, L, s.qkv.data(), n, positions, slots);
        clock.lap(kRope);
        attention(m, L, s.qkv.data(), n, vis, s.attn.data());
        clock.lap(kAttention);
        apply(L.o, s.attn.data(), n, s.y.data());
        add(s.x.data(), s.y.data(), n * H);
        clock.lap(kO);
        rms_norm(s.x.data(), L.mlp_norm, n, H, m.eps, s.h.data());
        clock.lap(kNorm);
        apply_parts(L.gate_up, s.h.data(), n, s.gu.data());
        clock.lap(kGateUp);
        silu_mul(s.gu.data(), n, m.inter, s.act.data());
        clock.lap(kSilu);
        apply(L.down, s.act.data(), n, s.y.data());
        add(s.x.data(), s.y.data(), n * H);
        clock.lap(kDown);
    }
    for (int64_t j = 0; j < wanted_n; ++j) std::memcpy(&s.y[j * H], &s.x[wanted[j] * H], H * sizeof(float));
    rms_norm(s.y.data(), m.final_norm, wanted_n, H, m.eps, s.h.data());
    apply(m.head, s.h.data(), wanted_n, logits);
    clock.lap(kHead);
}

// The seconds per stage since the last call (norm, qkv, rope, attention, o, gate_up, silu,
// down, head: kStages values), then zeroed.
void sd_decoder_timings(double* out) {
    for (int i = 0; i < kStages; ++i) {
        out[i] = stage_seconds[i];
        stage_seconds[i] = 0.0;
    }
}

// Copy cache slots from[i] -> to[i] in every layer and K/V head, in order (to[i] <= from[i],
// ascending: a tree's accepted path moved down onto consecutive slots).
void sd_decoder_move(const SdModel* model, const int64_t* from, const int64_t* to, int64_t count) {
    const SdModel& m = *model;
    const int64_t D = m.head_dim;
    for (int64_t i = 0; i < m.layers; ++i)
        for (int64_t h = 0; h < m.kv_heads; ++h)
            for (int64_t j = 0; j < count; ++j) {
                if (from[j] == to[j]) continue;
                const int64_t head = h * m.capacity;
                std::memcpy(m.layer[i].k_cache + (head + to[j]) * D, m.layer[i].k_cache + (head + from[j]) * D,
                            D * sizeof(Kv));
                std::memcpy(m.layer[i].v_cache + (head + to[j]) * D, m.layer[i].v_cache + (head + from[j]) * D,
                            D * sizeof(Kv));
            }
}

// out[i] = x[i] rounded to the K/V cache's binary16 (n a multiple of 16), by the decoder's own
// conversion or (portable = 1) half_bits; then back = those values as floats (load_half or
// half_value): tests pin both against IEEE's rounding.
void sd_decoder_half(const float* x, uint16_t* out, float* back, int64_t n, int portable) {
    for (int64_t i = 0; i < n; i += kLanes) {
        if (portable) {
            for (int l = 0; l < kLanes; ++l) out[i + l] = half_bits(x[i + l]), back[i + l] = half_value(out[i + l]);
        } else {
            store_half(out + i, x + i, kLanes);
            store(back + i, load_half(out + i));
        }
    }
}

}  // extern "C"
