"""The stand-in's own CuMemAllocator: records calls (vLLM's would map CUDA VMM memory)."""
import contextlib


class CuMemAllocator:
    default_tag = "default"
    instance = None
    calls = []

    @staticmethod
    def get_instance():
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        self.calls.append(("use_memory_pool", tag))
        yield

    def sleep(self, offload_tags=None):
        self.calls.append(("sleep", offload_tags))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def get_current_usage(self):
        return 0
