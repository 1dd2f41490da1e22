"""Other engines as specdec measures and compares against them: transformers' own generate(),
llama.cpp (llama-cpp-python, and its own llama-server), OpenAI-compatible endpoints."""
