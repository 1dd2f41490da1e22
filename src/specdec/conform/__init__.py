"""Conformance: `specdec check` (greedy equality, sampling chi-square, cache invariants), first
differences and whether they are ties, and the same comparison between two servers."""
