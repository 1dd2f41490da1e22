"""Weight-only int8 / int4 models (specdec.forward.linear's kernels): weights (weights.py), read from
a GGUF (gguf_source.py), per model (model.py), cached (cache.py)."""

MODES = ("none", "int8", "int4")  # --target-quant, --draft-quant and quant= in method specs
