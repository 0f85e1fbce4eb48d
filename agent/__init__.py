"""The node agent: discovers the machine (CPUs, memory, GPUs through NVML), runs bound tasks."""
