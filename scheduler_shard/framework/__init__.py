"""The shard's plugin framework: Status, plugin protocols, the registry and profiles."""
