"""What a command runs: the method-spec grammar, the table of method kinds, and how a spec
becomes a proposer (with the draft variants it needs)."""
