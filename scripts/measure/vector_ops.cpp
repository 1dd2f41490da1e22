// Throughput of AVX-512 vector instruction mixes (docs/runtime.md, "What bounds the Q4 tile"):
// 12 independent chains per loop iteration, ns per iteration of 12 instructions.
//     g++ -O2 -march=native scripts/measure/vector_ops.cpp -o /tmp/vector_ops && flock /tmp/cpu.lock /tmp/vector_ops
#include <immintrin.h>
#include <cstdio>
#include <chrono>
#define CH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
// 8 (or 6) dpbusd chains beside 4 (or 6) of another instruction's
#define MIX(X) OP8(0) OP8(1) OP8(2) OP8(3) OP8(4) OP8(5) OP8(6) OP8(7) X(8) X(9) X(10) X(11)
#define MIX6(X) OP8(0) OP8(1) OP8(2) OP8(3) OP8(4) OP8(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define KEEP(i) __asm__ volatile("" : "+v"(a##i));
template <int MODE> double run() {
  #define DECL(i) __m512i a##i=_mm512_set1_epi32(i+1);
  CH(DECL)
  __m512i b=_mm512_set1_epi32(3), c=_mm512_set1_epi32(5);
  const long N=50000000;
  auto t0=std::chrono::steady_clock::now();
  for (long n=0;n<N;++n) {
    if constexpr (MODE==0) { // dpbusd only
      #define OP(i) a##i=_mm512_dpbusd_epi32(a##i,b,c);
      CH(OP)
    } else if constexpr (MODE==1) { // add only
      #define OPA(i) a##i=_mm512_add_epi32(a##i,b);
      CH(OPA)
    } else if constexpr (MODE==2) { // mullo only
      #define OPM(i) a##i=_mm512_mullo_epi32(a##i,b);
      CH(OPM)
    } else if constexpr (MODE==3) { // 8 dpbusd + 4 add
      #define OP8(i) a##i=_mm512_dpbusd_epi32(a##i,b,c);
      MIX(OPA)
    } else if constexpr (MODE==4) { // cvt only
      #define OPC(i) a##i=_mm512_castps_si512(_mm512_cvtepi32_ps(a##i));
      CH(OPC)
    } else if constexpr (MODE==5) { // 8 dpbusd + 4 and
      #define OPN(i) a##i=_mm512_and_si512(a##i,b);
      MIX(OPN)
    } else if constexpr (MODE==6) { // 8 dpbusd + 4 cvt
      MIX(OPC)
    } else if constexpr (MODE==7) { // 8 dpbusd + 4 srli
      #define OPS(i) a##i=_mm512_srli_epi16(a##i,4);
      MIX(OPS)
    } else if constexpr (MODE==8) { // dpwssd only
      #define OPW(i) a##i=_mm512_dpwssd_epi32(a##i,b,c);
      CH(OPW)
    } else if constexpr (MODE==9) { // 8 dpbusd + 4 vpmovzxbd (from reg xmm)
      #define OPZ(i) a##i=_mm512_cvtepu8_epi32(_mm512_castsi512_si128(a##i));
      MIX(OPZ)
    } else if constexpr (MODE==10) { // 8 dpbusd + 4 vpermd
      #define OPP(i) a##i=_mm512_permutexvar_epi32(b, a##i);
      MIX(OPP)
    } else if constexpr (MODE==11) { // 8 dpbusd + 4 vpshufd
      #define OPH(i) a##i=_mm512_shuffle_epi32(a##i, _MM_PERM_BBBB);
      MIX(OPH)
    } else if constexpr (MODE==12) { // 6 dpbusd + 6 vpshufd
      MIX6(OPH)
    } else if constexpr (MODE==13) { // 6 dpbusd + 6 vpermd
      MIX6(OPP)
    }
    CH(KEEP)
  }
  double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  #define SUM(i) + _mm512_reduce_add_epi32(a##i)
  volatile int sum = 0 CH(SUM); (void)sum;
  return s*1e9/N; // ns per 12 ops
}
int main() {
  const char* names[] = {"12 dpbusd", "12 add", "12 mullo", "8 dpbusd+4 add", "12 cvt", "8 dpbusd+4 and", "8 dpbusd+4 cvt", "8 dpbusd+4 srli", "12 dpwssd", "8 dpbusd+4 movzx", "8 dpbusd+4 vpermd", "8 dpbusd+4 vpshufd", "6 dpbusd+6 vpshufd", "6 dpbusd+6 vpermd"};
  double r[14] = {run<0>(), run<1>(), run<2>(), run<3>(), run<4>(), run<5>(), run<6>(), run<7>(), run<8>(), run<9>(), run<10>(), run<11>(), run<12>(), run<13>()};
  for (int i = 0; i < 14; ++i) printf("%-18s %.3f ns per iteration\n", names[i], r[i]);
}
