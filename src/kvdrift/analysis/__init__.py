"""From samples to conclusions: decomposition, bounds and (later) study statistics."""
