"""OpenAI-compatible servers (vLLM, llama.cpp's llama-server, ...) as things to measure and check.

- spec: `--endpoint NAME=URL` read into an Endpoint, and the probe that finds what it serves;
- stream: one streamed, greedy completion, timed token by token, with the token ids from
  logprobs where the server gives them, and the server's own speculation counts (llama.cpp's
  `timings`);
- metrics: vLLM's speculative-decoding counters from its Prometheus `/metrics` text.
"""
