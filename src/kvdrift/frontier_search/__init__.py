"""The compression frontier: per method family, the least KV cache whose measure stays within
a tolerance, certified at a stated confidence (docs/method.md, "The compression frontier")."""
