"""kvdrift: measure how KV-cache eviction changes what a language model generates."""

__version__ = "0.1.0"
