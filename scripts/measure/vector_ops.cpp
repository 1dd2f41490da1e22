// Throughput of AVX-512 vector instruction mixes (docs/runtime.md, "What bounds the Q4 tile",
// and attention's conversions):
// 12 independent chains per loop iteration, ns per iteration of 12 instructions.
//     g++ -O2 -march=native scripts/measure/vector_ops.cpp -o /tmp/vector_ops && flock /tmp/cpu.lock /tmp/vector_ops
#include <immintrin.h>
#include <chrono>
#include <cstdio>

// One instruction on chain i (a##i), the other operands b and c fixed.
#define DPBUSD(i) a##i = _mm512_dpbusd_epi32(a##i, b, c);
#define ADD(i) a##i = _mm512_add_epi32(a##i, b);
#define MULLO(i) a##i = _mm512_mullo_epi32(a##i, b);
#define CVT(i) a##i = _mm512_castps_si512(_mm512_cvtepi32_ps(a##i));
#define AND(i) a##i = _mm512_and_si512(a##i, b);
#define SRLI(i) a##i = _mm512_srli_epi16(a##i, 4);
#define DPWSSD(i) a##i = _mm512_dpwssd_epi32(a##i, b, c);
#define MOVZX(i) a##i = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(a##i));
#define PERMD(i) a##i = _mm512_permutexvar_epi32(b, a##i);
#define SHUFD(i) a##i = _mm512_shuffle_epi32(a##i, _MM_PERM_BBBB);
// Float ones on the same registers (attention's scores: FMAs beside key conversions and shuffles).
#define FMA(i) a##i = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(a##i), _mm512_castsi512_ps(b), _mm512_castsi512_ps(c)));
#define CVTPH(i) a##i = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(a##i)));
#define SHUFF(i) a##i = _mm512_shuffle_i32x4(a##i, b, 0x44);

// All 12 chains one instruction; 8 (or 6) dpbusd chains beside 4 (or 6) of another.
#define ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define MIX(X) DPBUSD(0) DPBUSD(1) DPBUSD(2) DPBUSD(3) DPBUSD(4) DPBUSD(5) DPBUSD(6) DPBUSD(7) X(8) X(9) X(10) X(11)
#define MIX6(X) DPBUSD(0) DPBUSD(1) DPBUSD(2) DPBUSD(3) DPBUSD(4) DPBUSD(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define FMIX(X) FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) X(8) X(9) X(10) X(11)

// The mixes measured: (index, name, body).
#define MODES(M)                                                                                        \
    M(0, "12 dpbusd", ALL(DPBUSD)) M(1, "12 add", ALL(ADD)) M(2, "12 mullo", ALL(MULLO))                 \
    M(3, "8 dpbusd+4 add", MIX(ADD)) M(4, "12 cvt", ALL(CVT)) M(5, "8 dpbusd+4 and", MIX(AND))           \
    M(6, "8 dpbusd+4 cvt", MIX(CVT)) M(7, "8 dpbusd+4 srli", MIX(SRLI)) M(8, "12 dpwssd", ALL(DPWSSD))   \
    M(9, "8 dpbusd+4 movzx", MIX(MOVZX)) M(10, "8 dpbusd+4 vpermd", MIX(PERMD))                         \
    M(11, "8 dpbusd+4 vpshufd", MIX(SHUFD)) M(12, "6 dpbusd+6 vpshufd", MIX6(SHUFD))                     \
    M(13, "6 dpbusd+6 vpermd", MIX6(PERMD)) M(14, "12 fma", ALL(FMA)) M(15, "12 vcvtph2ps", ALL(CVTPH))     \
    M(16, "8 fma+4 vcvtph2ps", FMIX(CVTPH)) M(17, "8 fma+4 vshufi32x4", FMIX(SHUFF))

#define DECLARE(i) __m512i a##i = _mm512_set1_epi32(i + 1);
#define KEEP(i) __asm__ volatile("" : "+v"(a##i));  // each chain stays a register the loop must update
#define SUM(i) +_mm512_reduce_add_epi32(a##i)

template <int MODE>
double run() {
    ALL(DECLARE)
    const __m512i b = _mm512_set1_epi32(3), c = _mm512_set1_epi32(5);
    const long n = 50000000;
    const auto began = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) {
#define BODY(m, name, ops) \
    if constexpr (MODE == m) { ops }
        MODES(BODY)
        ALL(KEEP)
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    volatile int sum = 0 ALL(SUM);
    (void)sum;
    return s * 1e9 / n;
}

int main() {
#define PRINT(m, name, ops) printf("%-20s %.3f ns per iteration\n", name, run<m>());
    MODES(PRINT)
}
