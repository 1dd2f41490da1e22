"""specdec's own runtime for Llama-family models (Llama, Qwen2, Qwen3; GGUF files) on its Q4/Q5/Q8
kernels: one C++ call per forward (kernels/decoder.cpp, decoder.py), every row's logits
independent of the block it is computed in, behind the engine's model interface (native_lm.NativeLM).
Its weights: read from a GGUF or a dense model (weight_source), packed (decoder_weights), kept in
the model cache (stored_weights), loaded by loader. docs/runtime.md."""

from ...quant import MODES, NATIVE_ONLY

NATIVE_MODES = (*MODES[1:], *NATIVE_ONLY)  # the weight forms the native runtime runs (read at argument parsing)
