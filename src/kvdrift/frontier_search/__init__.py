"""The compression frontier: per method family, the least KV cache certified to keep a measure
within a tolerance at a stated confidence (docs/method.md, "The compression frontier")."""
