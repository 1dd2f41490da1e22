"""Prompts: built-in datasets and JSONL files, chat templates, exact-length long prompts from
real articles."""
