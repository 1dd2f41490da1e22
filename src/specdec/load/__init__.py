"""One loading layer: a LoadSpec (what to load: specdec.load.spec) is decided once into Choices
(the target's form, its runtime and the method, `auto` resolved, each with why:
specdec.load.choose) and loaded into a Loaded (target, tokenizer, proposer: specdec.load.loaded,
by way of specdec.load.models). The command line, the server, the scripts and the tests all load
so; specdec.load_gguf and specdec.load_model stay the entry points for one model. Importing it
imports no model library (torch and transformers load with the models)."""

from .choose import Choices, choose
from .loaded import Loaded, load
from .spec import LoadSpec

__all__ = ["Choices", "LoadSpec", "Loaded", "choose", "load"]
