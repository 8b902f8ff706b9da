"""vllm.device_allocator of the stand-in: the platform allocator vLLM's worker uses."""
from .cumem import CuMemAllocator


def get_mem_allocator_instance():
    return CuMemAllocator.get_instance()
