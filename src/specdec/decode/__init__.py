"""The decode core: the speculative round (engine), acceptance (verify, verify_tree), the model
interface it reaches models through (lm, cache), sampling, per-round statistics, and the
Proposal type and Proposer contract that proposers fill."""
