"""The cost model: expected accepted length, cost per token, predicted speedup, break-even
acceptance, optimal k, KV-cache bytes. Arithmetic only: it imports nothing of specdec's."""
