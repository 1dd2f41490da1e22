// decoder.cpp's attend_tile alone: R rows of one sequence over C cached keys, one K/V head's
// query heads, one thread, the cache in L2 (1,024 keys at the 1.5B target's shape: 512 KB of
// binary16 K and V; runtime_bench.py --parts rows times the forward, memory included): the
// best of 7 passes of `calls` calls, in ns per (row, query head, key), and a checksum
// of the outputs so two builds' bits can be compared. Build one binary per decoder.cpp and run
// them alternately (DECODER an absolute path: an #include's relative one starts at this folder):
//     g++ -O3 -ffp-contract=off -fopenmp -march=native -DDECODER="\"$PWD/src/specdec/kernels/decoder.cpp\"" scripts/measure/attention_tile.cpp -o /tmp/attention_tile
//     flock /tmp/cpu.lock /tmp/attention_tile 8 1024 300            # the 1.5B target: 12 heads, 2 K/V, 128 dims
//     flock /tmp/cpu.lock /tmp/attention_tile 8 1024 300 14 2 64    # the 0.5B draft
#include DECODER
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ROWS KEYS CALLS [HEADS KV_HEADS HEAD_DIM]\n", argv[0]);
        return 2;
    }
    const int64_t R = atol(argv[1]), C = atol(argv[2]);
    const int calls = atoi(argv[3]);
    const int64_t heads = argc > 4 ? atol(argv[4]) : 12, kv_heads = argc > 5 ? atol(argv[5]) : 2;
    const int64_t D = argc > 6 ? atol(argv[6]) : 128, capacity = C + R, group = heads / kv_heads;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> k_cache(kv_heads * capacity * D), v_cache(kv_heads * capacity * D);
    std::vector<float> floats(kv_heads * capacity * D);
    for (auto* cache : {&k_cache, &v_cache}) {
        for (auto& v : floats) v = normal(rng);
        store_half(cache->data(), floats.data(), int64_t(floats.size()));
    }
    SdModel m{};
    m.head_dim = D, m.heads = heads, m.kv_heads = kv_heads, m.capacity = capacity, m.attn_scale = 1.f / std::sqrt(float(D));
    SdLayer L{};
    L.k_cache = k_cache.data(), L.v_cache = v_cache.data();
    std::vector<float> qkv(R * (heads + 2 * kv_heads) * D), out(R * heads * D);
    for (auto& v : qkv) v = normal(rng);
    // row r: the C cached keys and the block's rows up to its own (a verify block's causal mask)
    std::vector<int64_t> lo(R, 0), prefix(R), start(R + 1, 0), split(R, 0), shared(R, 0);
    for (int64_t r = 0; r < R; ++r) prefix[r] = C + r + 1;
    const SdVisible vis{lo.data(), prefix.data(), start.data(), nullptr, split.data(), shared.data()};
    double best = 1e30, checksum = 0;
    for (int pass = 0; pass < 7; ++pass) {
        const auto began = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) attend_tile(m, L, qkv.data(), 0, R, 0, group, 0, vis, out.data());
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    }
    for (float v : out) checksum += v;
    printf("rows %ld keys %ld heads %ld/%ld dims %ld: %.1f us a call, %.3f ns a (row, head, key); checksum %.9g\n", R, C,
           group, heads, D, best / calls * 1e6, best / calls * 1e9 / double(R * group * C), checksum);
}
