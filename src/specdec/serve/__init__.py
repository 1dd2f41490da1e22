"""`specdec serve`: an OpenAI-compatible HTTP server that decodes speculatively.

- errors: OpenAI-style error bodies ({"error": {message, type, param, code}}) and their statuses;
- body: a POST's body read as JSON (application/json only, size and nesting bounded);
- request: a request's JSON checked and read into a Generation (what the worker runs), every bad
  field a 4xx error that says what to send instead (fields: one field's typed, bounded read);
- security: the web origins (CORS) and Host names the server answers;
- text: committed tokens -> text, incrementally, with stop strings (held back while they may
  still complete);
- worker: the one thread that owns the models and decodes the running requests together, round
  by round (continuous batching);
- respond: the OpenAI response and stream-chunk objects, with llama.cpp's `timings` and
  specdec's speculation figures;
- metrics: the Prometheus counters and histograms of /metrics;
- app: the Starlette application (routes, API key, body limit) served by uvicorn.

Nothing here imports torch, transformers or the HTTP stack at import time but the modules that
need them (worker, app), so `specdec --help` stays fast.
"""
