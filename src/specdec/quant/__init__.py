"""Weight-only int8 / int4 models (runtime.hf.linear's kernels): weights (weights.py), read from
a GGUF (gguf_source.py), per model (model_weights.py; installed and cached by models.quantized and
models.quant_cache)."""

MODES = ("none", "int8", "int4")  # --target-quant; a draft takes these and int3 (DRAFT_MODES)
# int3: 3-bit codes (quant.weights.q3_rtn), a form for drafts on the native runtime only: a
# draft need not be exact, and a step of it reads a fifth fewer bytes than int4's.
DRAFT_MODES = (*MODES, "int3")  # --draft-quant and quant=
NATIVE_ONLY = ("int3",)
