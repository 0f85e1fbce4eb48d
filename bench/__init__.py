"""Benchmarks: `gosched bench`."""
