"""The shard's plugin framework: plugin protocols (masks and score arrays over node rows), the
registry and profiles."""
