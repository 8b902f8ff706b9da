"""The stand-in's worker: it imports the allocator class by name when it is imported, as vLLM's
GPU worker does, and asks it for the instance later."""
from vllm.device_allocator.cumem import CuMemAllocator


def allocator():
    return CuMemAllocator.get_instance()
