"""A task's resource request: CPU, memory, GPUs (whole or a share of one), extended resources."""

from dataclasses import dataclass, field

from gosched.common.fast_pickle import fast_pickle

GPU_MILLI = 1000  # one whole GPU in milli-GPU


@fast_pickle
@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """What one task asks for. `gpus` whole GPUs, or `gpu_milli` (< 1000) of one GPU, never both.

    `gpu_memory_mib` is the GPU memory each assigned GPU must have in total (a model floor).
    """

    cpu_milli: int = 0
    memory: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    extended: tuple[tuple[str, int], ...] = field(default=())

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_milli > 0

    @property
    def gpu_total_milli(self) -> int:
        """GPU demand in milli-GPU: whole GPUs count 1000 each."""
        return self.gpus * GPU_MILLI + self.gpu_milli

    def extended_dict(self) -> dict[str, int]:
        return dict(self.extended)
