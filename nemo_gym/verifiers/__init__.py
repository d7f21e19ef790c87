"""Building blocks that several environments' verifiers share: an LLM judge, LaTeX answer extraction."""
