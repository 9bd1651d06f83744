"""Which sglang a run drives: targets, the version reader, role contexts, import shims, doctor."""
