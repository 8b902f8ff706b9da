"""The stand-in's own CuMemAllocator: records calls (vLLM's would map CUDA VMM memory)."""
import contextlib


class CuMemAllocator:
    default_tag = "default"
    instance = None
    calls = []


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


# get_instance through a reference of its own (not the module's name, which a plug-in may rebind):
# only patching the class itself reaches code that imported it before.
_Self = CuMemAllocator


def _get_instance():
    if _Self.instance is None:
        _Self.instance = _Self()
    return _Self.instance


CuMemAllocator.get_instance = staticmethod(_get_instance)
