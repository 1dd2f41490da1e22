"""transformers' runtime: a Hugging Face model of any architecture repacked in place (prepare:
packed linear layers, linear.py; row-by-row attention, attention.py; float32 logits) so that a
token's logits are the same decoded alone or verified in a block, run behind the engine's model
interface by causal_lm.CausalLM over a preallocated K/V cache (kv_cache). model_facts reads what
the loaders need off a model without importing transformers."""
