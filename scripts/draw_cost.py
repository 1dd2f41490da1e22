"""Time one token draw over the default models' vocabulary: torch.multinomial against
specdec.decode.sampling.draw (docs/design.md, "One host read per round")."""

import time

import torch

from specdec.decode.sampling import draw

VOCAB = 151936  # Qwen2.5's output rows


def per_call_ms(fn, calls: int = 100, runs: int = 5) -> float:
    for _ in range(20):  # warm-up
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return sorted(times)[runs // 2]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(VOCAB, generator=gen) * 3, -1)
    print(f"{torch.get_num_threads()} threads, vocabulary {VOCAB}, median of 5 x 100 draws")
    print(f"torch.multinomial(p, 1): {per_call_ms(lambda: torch.multinomial(p, 1, generator=gen)):.2f} ms")
    print(f"specdec draw(p):         {per_call_ms(lambda: draw(p, gen)):.2f} ms")


if __name__ == "__main__":
    main()
