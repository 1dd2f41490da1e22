// specdec's quantized matrix products: y = x W^T (+ b) for 3- to 8-bit weights in groups
// with integer sub-scales under float super-scales (GGUF's Q4_K and Q6_K, repacked), and int8
// activations quantized per row in blocks of 32 inputs.
//
// Why a row's result cannot depend on the block it is computed in: every row's activations are
// quantized from that row alone, the integer dot products are exact, and each output's float
// sum runs over the groups in one fixed order with the same operations, whatever the number of
// rows, their position, the thread count or the instruction set. The AVX-512 VNNI path (with
// AMX tiles for blocks of 9-16 rows), the AVX2 path and the portable reference below perform the
// same IEEE operations per output (mul, fma, add; the build passes -ffp-contract=off), so they
// agree bit for bit (tests/test_kernels.py).
//
// Layouts (T = N/16 tiles of 16 outputs; lane l is output 16t+l):
//   Q4: codes  [T][K/32][4][16][4] bytes: load j of group g holds, per lane, inputs 4j..4j+3 of
//              the group in its low nibbles and 16+4j..16+4j+3 in its high nibbles;
//       subs   [T][K/32][32] u8: 16 sub-scales, then 16 sub-mins;
//       supers [T][ceil(G/gps)][32] f32: 16 scales, then 16 mins (a super-block is gps groups:
//              8 for Q4_K, 1 for one float scale and min per group as Q4_1 has).
//       w = scale*sub_scale*q - min*sub_min.
//   Q3: as Q4 but codes [T][K/32][192] bytes, three 64-byte planes laid out [16][4] (lane, byte):
//              planes 0 and 1 hold the low 2 bits of inputs 0..15 and 16..31 (bits 2s, 2s+1 of
//              byte b: input 4s+b of the half), plane 2 their third bits (bit j of byte b: input
//              4j+b), so load j (inputs 4j..4j+3) is two shifts and masks away.
//   Q5: as Q4 but codes [T][K/32][320] bytes: the first 256 Q4's nibbles (the low 4 bits), then
//              a 64-byte plane [16][4] of fifth bits (bit j of byte b: input 4j+b), as Q3's
//              third bits; GGUF's Q5_K (8 groups a super-block), Q5_0 and Q5_1 (one) exactly.
//   Q8: codes  [T][K/16][4][16][4] bytes: load j of group g holds inputs 4j..4j+3 of the group;
//       subs   [T][K/16][16] i8 sub-scales; supers [T][ceil(G/gps)][16] f32 (a super-block is
//              gps groups of 16: 16 for Q6_K and rounded weights, 2 for Q8_0's scale per 32).
//       w = scale*sub_scale*(q - zero).
//   Q6: as Q8 (zero 32) for codes below 64 (GGUF's Q6_K) in 192 bytes a group: two 64-byte
//              vectors [16][4] of nibbles (the first: loads 0 and 1 in the low and high nibbles,
//              the second: loads 2 and 3), then a plane [16][4] of the codes' top two bits (bits
//              2j, 2j+1 of byte b: load j's byte b), three quarters of Q8's bytes for a row alone
//              to stream.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// The vector path the compiler may use (-march=native): AVX-512 VNNI, else AVX2 with FMA, else
// none (the portable path alone).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define SD_VNNI 1
#define SD_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SD_VNNI 0
#define SD_AVX2 1
#else
#define SD_VNNI 0
#define SD_AVX2 0
#endif
// AMX (Sapphire Rapids and later): blocks of more than kMaxRows rows take the integer dot
// products from the tile unit; Linux lends a process the tile state only on request.
#if SD_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>
#define SD_AMX 1
#else
#define SD_AMX 0
#endif

namespace {

constexpr int kBlock = 32;  // activation block (inputs per int8 scale)
constexpr int kMaxRows = 8;  // rows computed together, sharing each weight load (AVX2; AMX's threshold)
constexpr int kWideRows = 16;  // the same on the AMX path (its A tile's rows)
// The VNNI path's chunk where no AMX takes the blocks of more than kMaxRows: 16 rows' sums fit
// its 32 registers beside a group's 8 code vectors (one spill: a super-scale), so a group's
// unpack and scales serve twice the rows. With the activations in panels (Acts) it measured,
// 256 rows of the 1.5B target's shapes on Zen 5 against 8 rows a chunk: gate_up 1536 x 17920
// 11.0 -> 10.0 ms, down 8960 x 1536 5.9 -> 5.5 ms; 12 rows a chunk came between.
constexpr int kVnniRows = SD_VNNI ? 16 : kMaxRows;
static_assert(kVnniRows <= kWideRows, "run()'s acc holds kWideRows rows");
// Groups ahead of the one computed that the VNNI path prefetches: without it a tile's stream
// of codes is latency-bound (measured on Zen 5, 28 layers of the 1.5B target's shapes: 1 row
// 20.5 ms without, 19.3 at 12 ahead; 8 rows 55 against 24 ms); 20-48 ahead, into L1 or L2,
// measure alike.
constexpr int kAhead = 24;

// Rows per panel of the activations (below): a multiple of every chunk a tile takes (8, 16).
// One 16-row chunk's panel makes its activations one contiguous stream, group after group: 48
// rows (a chunk's rows 1 KB apart from the next group's) measured slower, prefill of the 1.5B
// target at 1024 rows a chunk (paired runtime_bench.py --parts prefill, 2 rounds): gate_up
// 2,400 -> 2,200 ms, 335 -> 350 tok/s.
constexpr int64_t kActPanel = 16;
static_assert(kActPanel % kMaxRows == 0 && kActPanel % kVnniRows == 0 && kActPanel % kWideRows == 0, "chunks within panels");

// One call's activations: row r's int8 values, a scale per block of 32, and the per-group terms
// the formats subtract (Q4: -sum(xq) * scale per group of 32; Q8: zero * sum(xq) per 16).
// Stored by panels of `panel` rows, block by block: a block's rows of a panel lie side by side
// (q: 32 bytes a row; scale, neg_sum: one value, zero_sum: two). A chunk's rows of a group are
// then one stream, each row a fixed offset from the first, where rows K bytes apart took a
// register (or a spill) for each row's address and a stream for each row.
struct Acts {
    std::vector<int8_t> q;
    std::vector<float> scale, neg_sum;
    std::vector<int32_t> zero_sum;
    int64_t panel = 1, blocks = 0;

    // Row r's block b: its index in scale and neg_sum (q: 32 bytes from 32 x that, zero_sum: 2 x).
    int64_t at(int64_t r, int64_t b) const { return (r / panel * blocks + b) * panel + r % panel; }
};

// One block of 32 inputs of a row: int8 values and their scale (the same IEEE operations in
// both paths: an exact max, one division, products rounded to nearest-even). A NaN input makes
// the scale NaN, so the outputs it reaches are NaN and the runtime's non-finite flag sees it:
// fmax and the max instructions drop a NaN operand, which would quietly quantize it to a number.
inline float quantize_block(const float* v, int8_t* q, int32_t* sums) {
    float amax = 0.f;
    bool nan = false;
    for (int i = 0; i < kBlock; ++i) {
        amax = std::fmax(amax, std::fabs(v[i]));
        nan |= std::isnan(v[i]);
    }
    if (nan) amax = std::numeric_limits<float>::quiet_NaN();
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    sums[0] = sums[1] = 0;
    for (int i = 0; i < kBlock; ++i) {
        const float t = std::fmin(127.f, std::fmax(-127.f, std::nearbyint(v[i] * inv)));
        q[i] = int8_t(t);
        sums[i / 16] += q[i];
    }
    return amax / 127.f;
}

#if SD_VNNI
inline float quantize_block_vnni(const float* v, int8_t* q, int32_t* sums) {
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const bool nan = (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) != 0;
    const float amax = nan ? std::numeric_limits<float>::quiet_NaN()
                           : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_roundscale_ps(_mm512_mul_ps(a, inv), round))));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_roundscale_ps(_mm512_mul_ps(b, inv), round))));
    _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(qb));
    sums[0] = _mm512_reduce_add_epi32(qa);
    sums[1] = _mm512_reduce_add_epi32(qb);
    return amax / 127.f;
}
#endif

#if SD_AVX2
inline float quantize_block_avx2(const float* v, int8_t* q, int32_t* sums) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 m = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (int i = 0; i < kBlock; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x));
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float amax = 0.f;
    for (float f : lanes) amax = std::fmax(amax, f);
    if (_mm256_movemask_ps(unordered)) amax = std::numeric_limits<float>::quiet_NaN();
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    int32_t ints[kBlock];
    for (int i = 0; i < kBlock; i += 8) {
        const __m256 t = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i*)(ints + i), _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, t))));
    }
    sums[0] = sums[1] = 0;
    for (int i = 0; i < kBlock; ++i) {
        q[i] = int8_t(ints[i]);
        sums[i / 16] += ints[i];
    }
    return amax / 127.f;
}
#endif

void quantize_rows(const void* x, int bf16, int64_t rows, int64_t K, int q8_zero, int portable, Acts& a) {
    const int64_t blocks = K / kBlock;
    a.panel = std::min(rows, kActPanel);  // one row: the rows' own order
    a.blocks = blocks;
    const int64_t padded = (rows + a.panel - 1) / a.panel * a.panel * blocks;
    a.q.resize((padded + kWideRows) * kBlock);  // room for a full A tile at any block's start
    a.scale.resize(padded);
    a.neg_sum.resize(padded);
    a.zero_sum.resize(padded * 2);
    // Threads take runs of (panel, block) items in storage order, so two threads' writes meet in
    // at most one cache line. Split by rows, the rows of one panel's block (scale, neg_sum: 4
    // bytes a row) shared a line across the threads in every block: 8 rows through 28 copies of
    // the 1.5B target's down (8,960 inputs) took 5.89 ms against 5.45 split this way (Zen 5, 21
    // paired passes).
    const int64_t panels = (rows + a.panel - 1) / a.panel;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t item = 0; item < panels * blocks; ++item) {
        const int64_t p = item / blocks, b = item % blocks;
        for (int64_t r = p * a.panel; r < std::min(rows, (p + 1) * a.panel); ++r) {
            float v[kBlock];
            const int64_t at = r * K + b * kBlock, ab = a.at(r, b);
            int8_t* q = &a.q[ab * kBlock];
            if (bf16) {
                const uint16_t* h = static_cast<const uint16_t*>(x) + at;
                for (int i = 0; i < kBlock; ++i) {
                    const uint32_t bits = uint32_t(h[i]) << 16;
                    std::memcpy(&v[i], &bits, 4);
                }
            } else {
                std::memcpy(v, static_cast<const float*>(x) + at, sizeof v);
            }
            int32_t sums[2];
#if SD_VNNI
            const float scale = portable ? quantize_block(v, q, sums) : quantize_block_vnni(v, q, sums);
#elif SD_AVX2
            const float scale = portable ? quantize_block(v, q, sums) : quantize_block_avx2(v, q, sums);
#else
            const float scale = quantize_block(v, q, sums);
#endif
            a.scale[ab] = scale;
            a.neg_sum[ab] = -float(sums[0] + sums[1]) * scale;
            a.zero_sum[ab * 2] = q8_zero * sums[0];
            a.zero_sum[ab * 2 + 1] = q8_zero * sums[1];
        }
    }
}

inline void store_out(const float* acc, const float* bias, int64_t n0, void* out, int bf16, int64_t at) {
    for (int l = 0; l < 16; ++l) {
        float y = acc[l];
        if (bias) y = y + bias[n0 + l];
        if (!bf16) {
            static_cast<float*>(out)[at + l] = y;
            continue;
        }
        uint32_t bits;
        std::memcpy(&bits, &y, 4);
        uint16_t h = std::isnan(y) ? uint16_t(0x7FC0) : uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
        static_cast<uint16_t*>(out)[at + l] = h;
    }
}

// Q4 (Bits = 4), Q3 and Q5: one format but for how a group's codes are stored.
template <int Bits>
struct QLow {
    static constexpr int kCodeBytes = 64 * Bits;  // a tile's codes per group of 32 inputs
    const uint8_t *codes, *subs;
    const float* supers;
    int64_t gps;  // groups per super-block
};
using Q4 = QLow<4>;
using Q3 = QLow<3>;
using Q5 = QLow<5>;

// Input i's code for lane l of a group's codes (the portable path's reading of the layouts).
inline int32_t code_at(const Q4&, const uint8_t* codes, int l, int i) {
    const uint8_t byte = codes[(i % 16 / 4) * 64 + l * 4 + i % 4];
    return i < 16 ? byte & 15 : byte >> 4;
}

inline int32_t code_at(const Q3&, const uint8_t* codes, int l, int i) {
    const int j = i / 4, b = l * 4 + i % 4;
    return ((codes[(j / 4) * 64 + b] >> (2 * (j % 4))) & 3) | (((codes[128 + b] >> j) & 1) << 2);
}
inline int32_t code_at(const Q5&, const uint8_t* codes, int l, int i) {
    return code_at(Q4{}, codes, l, i) | (((codes[256 + l * 4 + i % 4] >> (i / 4)) & 1) << 4);
}

// Q8 (Bits = 8) and Q6: one format but for how a group's codes are stored.
template <int Bits>
struct QHigh {
    static constexpr int kCodeBytes = 32 * Bits;  // a tile's codes per group of 16 inputs
    const uint8_t* codes;
    const int8_t* subs;
    const float* supers;
    int zero;
    int64_t gps;  // groups of 16 per super-block
};
using Q8 = QHigh<8>;
using Q6 = QHigh<6>;
template <typename W>
constexpr bool kHigh = false;  // Q8 or Q6: groups of 16, no AMX path
template <int Bits>
constexpr bool kHigh<QHigh<Bits>> = true;

// Input i's code for lane l of a group's codes (the portable path's reading of the layouts).
inline int32_t code_at(const Q8&, const uint8_t* codes, int l, int i) { return codes[(i / 4) * 64 + l * 4 + i % 4]; }
inline int32_t code_at(const Q6&, const uint8_t* codes, int l, int i) {
    const int j = i / 4, b = l * 4 + i % 4;
    return ((codes[(j / 2) * 64 + b] >> (4 * (j % 2))) & 15) | (((codes[128 + b] >> (2 * j)) & 3) << 4);
}

// The portable path: one output lane at a time, the same operations as the vector path.
template <int Bits>
void portable_tile(const QLow<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int rows, float (*acc)[16]) {
    const int64_t G = K / 32, SB = (G + w.gps - 1) / w.gps;
    for (int r = 0; r < rows; ++r)
        for (int l = 0; l < 16; ++l) acc[r][l] = 0.f;
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t* codes = w.codes + (t * G + g) * w.kCodeBytes;
        const uint8_t* subs = w.subs + (t * G + g) * 32;
        const float* sup = w.supers + (t * SB + g / w.gps) * 32;
        for (int l = 0; l < 16; ++l) {
            const float s = float(subs[l]) * sup[l], m = float(subs[16 + l]) * sup[16 + l];
            for (int r = 0; r < rows; ++r) {
                const int64_t blk = a.at(r0 + r, g);
                const int8_t* xq = &a.q[blk * 32];
                int32_t isum = 0;
                for (int i = 0; i < 32; ++i) isum += code_at(w, codes, l, i) * xq[i];
                acc[r][l] = std::fma(float(isum), s * a.scale[blk], acc[r][l]);
                acc[r][l] = std::fma(a.neg_sum[blk], m, acc[r][l]);
            }
        }
    }
}

template <int Bits>
void portable_tile(const QHigh<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int rows, float (*acc)[16]) {
    const int64_t G = K / 16, SB = (G + w.gps - 1) / w.gps;
    for (int r = 0; r < rows; ++r)
        for (int l = 0; l < 16; ++l) acc[r][l] = 0.f;
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t* codes = w.codes + (t * G + g) * w.kCodeBytes;
        const int8_t* subs = w.subs + (t * G + g) * 16;
        const float* sup = w.supers + (t * SB + g / w.gps) * 16;
        for (int l = 0; l < 16; ++l) {
            const float s = float(subs[l]) * sup[l];
            for (int r = 0; r < rows; ++r) {
                const int64_t half = a.at(r0 + r, g / 2) * 2 + g % 2;
                const int8_t* xq = &a.q[half * 16];
                int32_t isum = 0;
                for (int i = 0; i < 16; ++i) isum += code_at(w, codes, l, i) * xq[i];
                isum -= a.zero_sum[half];
                acc[r][l] = std::fma(float(isum), s * a.scale[half / 2], acc[r][l]);
            }
        }
    }
}

#if SD_VNNI
inline void prefetch(const void* codes, int bytes, const void* subs) {
    for (int i = 0; i < bytes; i += 64) _mm_prefetch(static_cast<const char*>(codes) + i, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(subs), _MM_HINT_T0);
}

// A group's codes as 8 vectors: c[j] holds, per lane, the codes of inputs 4j..4j+3.
inline void unpack(const Q4&, const uint8_t* codes, __m512i* c) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(codes + j * 64);
        c[j] = _mm512_and_si512(v, low);
        c[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
}

// The 16-bit shifts move bits across a word's bytes only where the masks then clear them.
template <int J>
inline __m512i q3_load(const __m512i* planes) {
    const __m512i low2 = _mm512_and_si512(_mm512_srli_epi16(planes[J / 4], 2 * (J % 4)), _mm512_set1_epi8(3));
    const __m512i third = J <= 2 ? _mm512_slli_epi16(planes[2], 2 - J) : _mm512_srli_epi16(planes[2], J - 2);
    return _mm512_or_si512(low2, _mm512_and_si512(third, _mm512_set1_epi8(4)));
}

inline void unpack(const Q3&, const uint8_t* codes, __m512i* c) {
    const __m512i planes[3] = {_mm512_loadu_si512(codes), _mm512_loadu_si512(codes + 64),
                               _mm512_loadu_si512(codes + 128)};
    c[0] = q3_load<0>(planes), c[1] = q3_load<1>(planes), c[2] = q3_load<2>(planes), c[3] = q3_load<3>(planes);
    c[4] = q3_load<4>(planes), c[5] = q3_load<5>(planes), c[6] = q3_load<6>(planes), c[7] = q3_load<7>(planes);
}

// Q4's nibbles, then the fifth bits moved to bit 4 of each byte (the 16-bit shifts carry bits
// across a word's bytes only where the mask then clears them).
template <int J>
inline __m512i q5_high(__m512i plane) {
    const __m512i at4 = J <= 4 ? _mm512_slli_epi16(plane, 4 - J) : _mm512_srli_epi16(plane, J - 4);
    return _mm512_and_si512(at4, _mm512_set1_epi8(16));
}

inline void unpack(const Q5&, const uint8_t* codes, __m512i* c) {
    unpack(Q4{}, codes, c);
    const __m512i p = _mm512_loadu_si512(codes + 256);
    c[0] = _mm512_or_si512(c[0], q5_high<0>(p)), c[1] = _mm512_or_si512(c[1], q5_high<1>(p));
    c[2] = _mm512_or_si512(c[2], q5_high<2>(p)), c[3] = _mm512_or_si512(c[3], q5_high<3>(p));
    c[4] = _mm512_or_si512(c[4], q5_high<4>(p)), c[5] = _mm512_or_si512(c[5], q5_high<5>(p));
    c[6] = _mm512_or_si512(c[6], q5_high<6>(p)), c[7] = _mm512_or_si512(c[7], q5_high<7>(p));
}

// A Q8 group's codes as 4 vectors: c[j] holds, per lane, the codes of inputs 4j..4j+3.
inline void unpack(const Q8&, const uint8_t* codes, __m512i* c) {
    for (int j = 0; j < 4; ++j) c[j] = _mm512_loadu_si512(codes + j * 64);
}

// Q6's nibbles, then the top two bits moved to bits 4 and 5 of each byte (the 16-bit shifts
// carry bits across a word's bytes only where the mask then clears them).
template <int J>
inline __m512i q6_top(__m512i plane) {
    const __m512i at4 = J < 2 ? _mm512_slli_epi16(plane, 4 - 2 * J) : _mm512_srli_epi16(plane, 2 * J - 4);
    return _mm512_and_si512(at4, _mm512_set1_epi8(0x30));
}

inline void unpack(const Q6&, const uint8_t* codes, __m512i* c) {
    const __m512i low = _mm512_set1_epi8(0x0F), p = _mm512_loadu_si512(codes + 128);
    const __m512i v0 = _mm512_loadu_si512(codes), v1 = _mm512_loadu_si512(codes + 64);
    c[0] = _mm512_or_si512(_mm512_and_si512(v0, low), q6_top<0>(p));
    c[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low), q6_top<1>(p));
    c[2] = _mm512_or_si512(_mm512_and_si512(v1, low), q6_top<2>(p));
    c[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low), q6_top<3>(p));
}

// A Q3/Q4/Q5 tile's scales group by group: s = super-scale x sub-scale and m = super-min x
// sub-min per lane (the super-scales reloaded every gps groups by a counter: a division per
// group costs).
template <int Bits>
struct LowScales {
    const int64_t gps;
    const float* sup;
    const uint8_t* subs;
    int64_t in_super = 0;
    __m512 d = _mm512_setzero_ps(), dm = _mm512_setzero_ps();

    LowScales(const QLow<Bits>& w, int64_t t, int64_t G)
        : gps(w.gps), sup(w.supers + t * ((G + w.gps - 1) / w.gps) * 32), subs(w.subs + t * G * 32) {}

    void next(__m512& s, __m512& m) {
        if (in_super-- == 0) {
            d = _mm512_loadu_ps(sup);
            dm = _mm512_loadu_ps(sup + 16);
            sup += 32;
            in_super = gps - 1;
        }
        s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)subs))), d);
        m = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(subs + 16)))), dm);
        subs += 32;
    }
};

// One row's step over a Q3/Q4/Q5 group, in the order every path takes:
// acc + isum * (s * x's scale), then + x's -sum * m.
inline __m512 low_step(__m512 acc, __m512i isum, __m512 s, __m512 m, float scale, float neg_sum) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_set1_ps(scale)), acc);
    return _mm512_fmadd_ps(_mm512_set1_ps(neg_sum), m, acc);
}

template <int R, int Bits>
void vnni_rows(const QLow<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, float (*out)[16]) {
    const int64_t G = K / 32, first = a.at(r0, 0);  // row r0 + r of group g: first + g * panel + r
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    LowScales<Bits> scales(w, t, G);
    for (int64_t g = 0; g < G; ++g) {
        __m512 s, m;
        scales.next(s, m);
        const uint8_t* codes = w.codes + (t * G + g) * w.kCodeBytes;
        prefetch(codes + kAhead * w.kCodeBytes, w.kCodeBytes, w.subs + (t * G + g + kAhead) * 32);
        __m512i c[8];
        unpack(w, codes, c);
        // Unrolled, so acc[] stays in registers (GCC keeps a loop over 16 rows rolled, and the
        // sums then go through memory).
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const int64_t blk = first + g * a.panel + r;
            const int32_t* xq = reinterpret_cast<const int32_t*>(&a.q[blk * 32]);
            // Two chains: one a row (8 dpbusd deep) measured 3-6% slower, its latency exposed.
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                i0 = _mm512_dpbusd_epi32(i0, c[j], _mm512_set1_epi32(xq[j]));
                i1 = _mm512_dpbusd_epi32(i1, c[4 + j], _mm512_set1_epi32(xq[4 + j]));
            }
            acc[r] = low_step(acc[r], _mm512_add_epi32(i0, i1), s, m, a.scale[blk], a.neg_sum[blk]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

template <int R, int Bits>
void vnni_rows(const QHigh<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, float (*out)[16]) {
    const int64_t G = K / 16, SB = (G + w.gps - 1) / w.gps, first = a.at(r0, 0);
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    __m512 d = _mm512_setzero_ps();
    const float* sup = w.supers + t * SB * 16;
    for (int64_t g = 0, in_super = 0; g < G; ++g) {
        if (in_super-- == 0) {
            d = _mm512_loadu_ps(sup);
            sup += 16;
            in_super = w.gps - 1;
        }
        const int8_t* subs = w.subs + (t * G + g) * 16;
        const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)subs))), d);
        const uint8_t* codes = w.codes + (t * G + g) * w.kCodeBytes;
        prefetch(codes + kAhead * w.kCodeBytes, w.kCodeBytes, subs + kAhead * 16);
        __m512i c[4];
        unpack(w, codes, c);
#pragma GCC unroll 16  // as in the Q3/Q4/Q5 rows
        for (int r = 0; r < R; ++r) {
            const int64_t half = (first + g / 2 * a.panel + r) * 2 + g % 2;
            const int32_t* xq = reinterpret_cast<const int32_t*>(&a.q[half * 16]);
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
            i0 = _mm512_dpbusd_epi32(i0, c[0], _mm512_set1_epi32(xq[0]));
            i1 = _mm512_dpbusd_epi32(i1, c[1], _mm512_set1_epi32(xq[1]));
            i0 = _mm512_dpbusd_epi32(i0, c[2], _mm512_set1_epi32(xq[2]));
            i1 = _mm512_dpbusd_epi32(i1, c[3], _mm512_set1_epi32(xq[3]));
            const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(i0, i1), _mm512_set1_epi32(a.zero_sum[half]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_set1_ps(a.scale[half / 2])), acc[r]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

// A tile's rows with the row count a template argument (acc[] then stays in registers).
template <typename W>
void vector_tile(const W& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int rows, float (*acc)[16]) {
    switch (rows) {
        case 1: vnni_rows<1>(w, a, K, t, r0, acc); break;
        case 2: vnni_rows<2>(w, a, K, t, r0, acc); break;
        case 3: vnni_rows<3>(w, a, K, t, r0, acc); break;
        case 4: vnni_rows<4>(w, a, K, t, r0, acc); break;
        case 5: vnni_rows<5>(w, a, K, t, r0, acc); break;
        case 6: vnni_rows<6>(w, a, K, t, r0, acc); break;
        case 7: vnni_rows<7>(w, a, K, t, r0, acc); break;
        case 8: vnni_rows<8>(w, a, K, t, r0, acc); break;
        case 9: vnni_rows<9>(w, a, K, t, r0, acc); break;
        case 10: vnni_rows<10>(w, a, K, t, r0, acc); break;
        case 11: vnni_rows<11>(w, a, K, t, r0, acc); break;
        case 12: vnni_rows<12>(w, a, K, t, r0, acc); break;
        case 13: vnni_rows<13>(w, a, K, t, r0, acc); break;
        case 14: vnni_rows<14>(w, a, K, t, r0, acc); break;
        case 15: vnni_rows<15>(w, a, K, t, r0, acc); break;
        default: vnni_rows<16>(w, a, K, t, r0, acc); break;
    }
}
#endif

#if SD_AMX
// The tile unit computes the same exact int32 sums as vnni_rows's dpbusd chains (a row's
// activations signed, the codes unsigned; nothing overflows), and the float steps after them
// are vnni_rows's own (low_step), in the same order: a row's bits do not change with the path.
// Tiles: 0 = a group's activations of up to 16 rows (A, strided straight from the quantized
// rows; rows past the block's are read, a.q has room, and their sums dropped), 1 = its codes
// (B, row j = unpack's c[j]: inputs 4j..4j+3 of each of the 16 lanes), 2..5 = the sums of four
// groups in flight (C, a row's 16 lanes), so the tile work runs ahead of the float steps. Q8's and Q6's
// groups of 16 stay on VNNI: tiles half as deep measured slower than dpbusd there.
constexpr int kAmxRows = 16;
constexpr int kAmxDepth = 4;

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {32, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {kAmxRows, 8, kAmxRows, kAmxRows, kAmxRows, kAmxRows};
};

bool amx_granted() {
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // arch_prctl(2), Linux >= 5.16
    static const bool granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
    return granted;
}

// A thread's tile configuration for one parallel region (torch's oneDNN uses the tiles too,
// with its own configuration, so none is assumed to outlive the region).
struct AmxScope {
    const bool on;
    explicit AmxScope(bool on) : on(on) {
        static const TileConfig config;
        if (on) _tile_loadconfig(&config);
    }
    ~AmxScope() {
        if (on) _tile_release();
    }
};

// sums[16][16] = x's 16 rows (stride K) times the codes in b, on C tile C. GCC's tile
// intrinsics paste the tile number into their assembly, so it is a literal in each.
#define SD_TILE_SUMS(C)                                                                    \
    inline void tile_sums##C(const int8_t* x, int64_t K, const uint8_t* b, int32_t* sums) { \
        _tile_loadd(0, x, K);                                                              \
        _tile_loadd(1, b, 64);                                                             \
        _tile_zero(C);                                                                     \
        _tile_dpbsud(C, 0, 1);                                                             \
        _tile_stored(C, sums, 64);                                                         \
    }
SD_TILE_SUMS(2)
SD_TILE_SUMS(3)
SD_TILE_SUMS(4)
SD_TILE_SUMS(5)
#undef SD_TILE_SUMS

// Group g's int32 sums of rows r0.. into sums[16][16], b the group's codes as B.
template <int Bits>
inline void amx_sums(const QLow<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int64_t g, uint8_t* b,
                     int32_t* sums) {
    const int64_t G = K / 32;
    const uint8_t* codes = w.codes + (t * G + g) * w.kCodeBytes;
    prefetch(codes + kAhead * w.kCodeBytes, w.kCodeBytes, w.subs + (t * G + g + kAhead) * 32);
    __m512i c[8];
    unpack(w, codes, c);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(b + 64 * j, c[j]);
    const int8_t* x = &a.q[a.at(r0, g) * 32];  // rows 32 bytes apart in a panel
    switch (g % kAmxDepth) {
        case 0: tile_sums2(x, 32, b, sums); break;
        case 1: tile_sums3(x, 32, b, sums); break;
        case 2: tile_sums4(x, 32, b, sums); break;
        default: tile_sums5(x, 32, b, sums); break;
    }
}

template <int R, int Bits>
void amx_rows(const QLow<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, float (*out)[16]) {
    const int64_t G = K / 32;
    alignas(64) uint8_t b[kAmxDepth][8 * 64];
    alignas(64) int32_t sums[kAmxDepth][kAmxRows * 16];
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    LowScales<Bits> scales(w, t, G);
    for (int64_t g = 0; g < G && g < kAmxDepth - 1; ++g) amx_sums(w, a, K, t, r0, g, b[g], sums[g]);
    for (int64_t g = 0; g < G; ++g) {
        const int64_t ahead = g + kAmxDepth - 1;
        if (ahead < G) amx_sums(w, a, K, t, r0, ahead, b[ahead % kAmxDepth], sums[ahead % kAmxDepth]);
        __m512 s, m;
        scales.next(s, m);
        const int32_t* s32 = sums[g % kAmxDepth];
        for (int r = 0; r < R; ++r) {
            const int64_t blk = a.at(r0 + r, g);
            acc[r] = low_step(acc[r], _mm512_load_si512(s32 + 16 * r), s, m, a.scale[blk], a.neg_sum[blk]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

// A block of kMaxRows + 1 .. kAmxRows rows.
template <typename W>
void amx_tile(const W& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int rows, float (*acc)[16]) {
    switch (rows) {
        case 9: amx_rows<9>(w, a, K, t, r0, acc); break;
        case 10: amx_rows<10>(w, a, K, t, r0, acc); break;
        case 11: amx_rows<11>(w, a, K, t, r0, acc); break;
        case 12: amx_rows<12>(w, a, K, t, r0, acc); break;
        case 13: amx_rows<13>(w, a, K, t, r0, acc); break;
        case 14: amx_rows<14>(w, a, K, t, r0, acc); break;
        case 15: amx_rows<15>(w, a, K, t, r0, acc); break;
        default: amx_rows<16>(w, a, K, t, r0, acc); break;
    }
}
#endif

#if SD_AVX2
// AVX2 has no u8 x s8 -> s32 dot product: maddubs (u8 x s8 pairs -> s16, saturating) then madd
// with ones. Q4 codes (<= 15) times int8 keep a pair below 2^15; Q8 codes are taken as the
// signed q - zero and multiplied by |x| with x's sign moved onto them (|q - zero|, |x| <= 127).
// The integer sums equal the other paths' exactly, so the float steps that follow are theirs.
inline __m256i dot4(__m256i u8, __m256i s8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1));
}

// The dot products of n code vectors c[j] with the broadcast 4-input words xq[j], summed: the
// maddubs pair sums added as int16 before one madd widens them (half the multiplies of a madd
// per vector). Exact while n pair sums fit an int16: callers pass n * 2 * max|code| * 127 < 2^15.
template <int N>
inline __m256i dot_sum(const __m256i* c, const int32_t* xq) {
    __m256i pairs = _mm256_maddubs_epi16(c[0], _mm256_set1_epi32(xq[0]));
    for (int j = 1; j < N; ++j) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(c[j], _mm256_set1_epi32(xq[j])));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Half h of a group's codes (lanes 8h..8h+7; `codes` already offset by 32h) as 8 vectors:
// c[j] holds, per lane, the codes of inputs 4j..4j+3 (as the VNNI path's unpack).
inline void unpack_half(const Q4&, const uint8_t* codes, __m256i* c) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(codes + j * 64));
        c[j] = _mm256_and_si256(v, low);
        c[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
}

inline void unpack_half(const Q3&, const uint8_t* codes, __m256i* c) {
    const __m256i p[3] = {_mm256_loadu_si256((const __m256i*)codes), _mm256_loadu_si256((const __m256i*)(codes + 64)),
                          _mm256_loadu_si256((const __m256i*)(codes + 128))};
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    for (int j = 0; j < 8; ++j) {
        const __m128i by = _mm_cvtsi32_si128(2 * (j % 4));
        const __m256i low2 = _mm256_and_si256(_mm256_srl_epi16(p[j / 4], by), three);
        const __m256i third = j <= 2 ? _mm256_sll_epi16(p[2], _mm_cvtsi32_si128(2 - j))
                                     : _mm256_srl_epi16(p[2], _mm_cvtsi32_si128(j - 2));
        c[j] = _mm256_or_si256(low2, _mm256_and_si256(third, four));
    }
}

inline void unpack_half(const Q5&, const uint8_t* codes, __m256i* c) {
    unpack_half(Q4{}, codes, c);
    const __m256i p = _mm256_loadu_si256((const __m256i*)(codes + 256));
    const __m256i bit4 = _mm256_set1_epi8(16);
    for (int j = 0; j < 8; ++j) {
        const __m256i at4 = j <= 4 ? _mm256_sll_epi16(p, _mm_cvtsi32_si128(4 - j))
                                   : _mm256_srl_epi16(p, _mm_cvtsi32_si128(j - 4));
        c[j] = _mm256_or_si256(c[j], _mm256_and_si256(at4, bit4));
    }
}

template <int R, int Bits>
void avx2_rows(const QLow<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, float (*out)[16]) {
    const int64_t G = K / 32, SB = (G + w.gps - 1) / w.gps;
    for (int h = 0; h < 2; ++h) {  // lanes 8h .. 8h+7
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        __m256 d = _mm256_setzero_ps(), dm = _mm256_setzero_ps();
        const float* sup = w.supers + t * SB * 32;
        for (int64_t g = 0, in_super = 0; g < G; ++g) {
            if (in_super-- == 0) {
                d = _mm256_loadu_ps(sup + 8 * h);
                dm = _mm256_loadu_ps(sup + 16 + 8 * h);
                sup += 32;
                in_super = w.gps - 1;
            }
            const uint8_t* subs = w.subs + (t * G + g) * 32;
            const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(subs + 8 * h)))), d);
            const __m256 m = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(subs + 16 + 8 * h)))), dm);
            __m256i c[8];
            unpack_half(w, w.codes + (t * G + g) * w.kCodeBytes + 32 * h, c);
            for (int r = 0; r < R; ++r) {
                const int64_t blk = a.at(r0 + r, g);
                const int32_t* xq = reinterpret_cast<const int32_t*>(&a.q[blk * 32]);
                // pair sums below 2 * 15 * 127 (Q4), 2 * 7 * 127 (Q3): 8 fit an int16; Q5's 2 * 31 * 127: 4
                const __m256i isum = Bits == 5 ? _mm256_add_epi32(dot_sum<4>(c, xq), dot_sum<4>(c + 4, xq + 4))
                                               : dot_sum<8>(c, xq);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s, _mm256_set1_ps(a.scale[blk])), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a.neg_sum[blk]), m, acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * h, acc[r]);
    }
}

// Half h of a Q8 or Q6 group's codes (`codes` already offset by 32h) as 4 vectors, as unpack_half.
inline void unpack_half(const Q8&, const uint8_t* codes, __m256i* c) {
    for (int j = 0; j < 4; ++j) c[j] = _mm256_loadu_si256((const __m256i*)(codes + j * 64));
}

inline void unpack_half(const Q6&, const uint8_t* codes, __m256i* c) {
    const __m256i v[2] = {_mm256_loadu_si256((const __m256i*)codes), _mm256_loadu_si256((const __m256i*)(codes + 64))};
    const __m256i p = _mm256_loadu_si256((const __m256i*)(codes + 128));
    const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    for (int j = 0; j < 4; ++j) {
        const __m256i nibble = j % 2 ? _mm256_srli_epi16(v[j / 2], 4) : v[j / 2];
        const __m256i at4 = j < 2 ? _mm256_sll_epi16(p, _mm_cvtsi32_si128(4 - 2 * j))
                                  : _mm256_srl_epi16(p, _mm_cvtsi32_si128(2 * j - 4));
        c[j] = _mm256_or_si256(_mm256_and_si256(nibble, low), _mm256_and_si256(at4, top));
    }
}

template <int R, int Bits>
void avx2_rows(const QHigh<Bits>& w, const Acts& a, int64_t K, int64_t t, int64_t r0, float (*out)[16]) {
    const int64_t G = K / 16, SB = (G + w.gps - 1) / w.gps;
    const __m256i zero = _mm256_set1_epi8(char(w.zero));
    const bool six_bit = w.zero == 32;  // Q6_K's codes: |q - zero| <= 32, 4 pair sums below 2^15
    for (int h = 0; h < 2; ++h) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        __m256 d = _mm256_setzero_ps();
        const float* sup = w.supers + t * SB * 16 + 8 * h;
        for (int64_t g = 0, in_super = 0; g < G; ++g) {
            if (in_super-- == 0) {
                d = _mm256_loadu_ps(sup);
                sup += 16;
                in_super = w.gps - 1;
            }
            const int8_t* subs = w.subs + (t * G + g) * 16 + 8 * h;
            const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)subs))), d);
            __m256i c[4];
            unpack_half(w, w.codes + (t * G + g) * w.kCodeBytes + 32 * h, c);
            for (int j = 0; j < 4; ++j) c[j] = _mm256_sub_epi8(c[j], zero);
            for (int r = 0; r < R; ++r) {
                const int64_t half = a.at(r0 + r, g / 2) * 2 + g % 2;
                const int32_t* xq = reinterpret_cast<const int32_t*>(&a.q[half * 16]);
                __m256i isum = _mm256_setzero_si256();
                if (six_bit) {
                    __m256i pairs = _mm256_setzero_si256();
                    for (int j = 0; j < 4; ++j) {
                        const __m256i x = _mm256_set1_epi32(xq[j]);
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(c[j], x)));
                    }
                    isum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
                } else {
                    for (int j = 0; j < 4; ++j) {
                        const __m256i x = _mm256_set1_epi32(xq[j]);
                        isum = _mm256_add_epi32(isum, dot4(_mm256_abs_epi8(x), _mm256_sign_epi8(c[j], x)));
                    }
                }
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s, _mm256_set1_ps(a.scale[half / 2])), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * h, acc[r]);
    }
}

// Rows four at a time, the rest together: each chunk unpacks the tile's codes once for its rows.
// 4 rows spill a little of the 16 vector registers and still beat 2 (the 28-layer int4 pass on
// the Zen 3: 8 rows 104-113 ms against 153-158, 32 rows 430-440 against 570-617); 8 spill too
// much (127-141 ms). A row's operations are the same in any chunk.
template <typename W>
void vector_tile(const W& w, const Acts& a, int64_t K, int64_t t, int64_t r0, int rows, float (*acc)[16]) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) avx2_rows<4>(w, a, K, t, r0 + r, acc + r);
    switch (rows - r) {
        case 3: avx2_rows<3>(w, a, K, t, r0 + r, acc + r); break;
        case 2: avx2_rows<2>(w, a, K, t, r0 + r, acc + r); break;
        case 1: avx2_rows<1>(w, a, K, t, r0 + r, acc + r); break;
    }
}
#endif

// The int8 activations of a block of rows that every tile passes over before the next block: they
// stay in L2 meanwhile, where all rows at once (a prefill's) were read again from L3 for each tile.
constexpr int64_t kBlockBytes = 192 * 1024;

// y[rows, N] for every tile, the rows in chunks of kVnniRows (blocks of whole chunks, one after
// another); each (tile, chunk) is one thread's work, so the split over threads cannot change an
// output. `wide` (null or the AMX path) takes chunks of more than kMaxRows rows, up to kWideRows.
template <typename W, typename Tile>
void run(const W& w, const Acts& a, int64_t rows, int64_t K, int64_t N, const float* bias, void* out, int out_bf16,
         Tile tile, Tile wide = nullptr) {
    const int64_t T = N / 16;
    const int most = !wide ? kVnniRows : rows > kMaxRows ? kWideRows : kMaxRows;
    const int64_t block = std::max<int64_t>(most, kBlockBytes / K / most * most);
#pragma omp parallel
    {
#if SD_AMX
        const AmxScope tiles(most > kMaxRows);
#endif
        for (int64_t b0 = 0; b0 < rows; b0 += block) {
            const int64_t b1 = std::min(rows, b0 + block);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; ++t) {
                float acc[kWideRows][16];
                for (int64_t r0 = b0; r0 < b1; r0 += most) {
                    const int chunk = int(b1 - r0 < most ? b1 - r0 : most);
                    (wide && chunk > kMaxRows ? wide : tile)(w, a, K, t, r0, chunk, acc);
                    for (int r = 0; r < chunk; ++r) store_out(acc[r], bias, t * 16, out, out_bf16, (r0 + r) * N + t * 16);
                }
            }
        }
    }
}

thread_local Acts acts;

// A tile of either path: (weight, activations, K, tile, first row, rows, out[rows][16]).
template <typename W>
using Tile = void (*)(const W&, const Acts&, int64_t, int64_t, int64_t, int, float (*)[16]);

template <typename W>
void linear(const W& w, const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, int zero, const float* bias,
            void* out, int out_bf16, int portable) {
    quantize_rows(x, x_bf16, rows, K, zero, portable, acts);
#if SD_AMX
    if constexpr (!kHigh<W>)
        if (!portable && amx_granted())
            return run(w, acts, rows, K, N, bias, out, out_bf16, Tile<W>(vector_tile<W>), Tile<W>(amx_tile<W>));
#endif
#if SD_VNNI || SD_AVX2
    if (!portable) return run(w, acts, rows, K, N, bias, out, out_bf16, Tile<W>(vector_tile<W>));
#endif
    run(w, acts, rows, K, N, bias, out, out_bf16, Tile<W>(portable_tile));
}

}  // namespace

extern "C" {

// 2: AVX-512 VNNI, 1: AVX2, 0: the portable path only.
int sd_vector_path() { return SD_VNNI ? 2 : SD_AVX2; }

// 1 where blocks of more than 8 rows run on AMX tiles (built for them and granted by the OS).
int sd_amx() {
#if SD_AMX
    return amx_granted();
#else
    return 0;
#endif
}

// x: [rows, K] float32 (x_bf16 = 0) or bfloat16; out: [rows, N] likewise by out_bf16; bias: N
// float32 or null. K % 32 == 0, N % 16 == 0 (checked by the caller). portable = 1 runs the
// portable path (tests compare the two).
void sd_q4_linear(const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, const uint8_t* codes,
                  const uint8_t* subs, const float* supers, int64_t gps, const float* bias, void* out, int out_bf16,
                  int portable) {
    linear(Q4{codes, subs, supers, gps}, x, x_bf16, rows, K, N, 0, bias, out, out_bf16, portable);
}

// As sd_q4_linear for Q3 codes.
void sd_q3_linear(const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, const uint8_t* codes,
                  const uint8_t* subs, const float* supers, int64_t gps, const float* bias, void* out, int out_bf16,
                  int portable) {
    linear(Q3{codes, subs, supers, gps}, x, x_bf16, rows, K, N, 0, bias, out, out_bf16, portable);
}

// As sd_q4_linear for Q5 codes.
void sd_q5_linear(const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, const uint8_t* codes,
                  const uint8_t* subs, const float* supers, int64_t gps, const float* bias, void* out, int out_bf16,
                  int portable) {
    linear(Q5{codes, subs, supers, gps}, x, x_bf16, rows, K, N, 0, bias, out, out_bf16, portable);
}

void sd_q8_linear(const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, const uint8_t* codes,
                  const int8_t* subs, const float* supers, int zero, int64_t gps, const float* bias, void* out,
                  int out_bf16, int portable) {
    linear(Q8{codes, subs, supers, zero, gps}, x, x_bf16, rows, K, N, zero, bias, out, out_bf16, portable);
}

// As sd_q8_linear for Q6 codes (zero 32).
void sd_q6_linear(const void* x, int x_bf16, int64_t rows, int64_t K, int64_t N, const uint8_t* codes,
                  const int8_t* subs, const float* supers, int zero, int64_t gps, const float* bias, void* out,
                  int out_bf16, int portable) {
    linear(Q6{codes, subs, supers, zero, gps}, x, x_bf16, rows, K, N, zero, bias, out, out_bf16, portable);
}

}  // extern "C"
