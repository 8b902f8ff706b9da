"""The stand-in's sleep-mode backends, after the interface of vLLM PR #44074: an abstract
SleepModeBackend (suspend(level), resume(tags), state(), capability class methods), the built-in
"cumem" backend and SleepModeBackendFactory (register_backend(name, module_path, class_name),
get_backend_class(name), create_backend(model_config))."""
import importlib
from abc import ABC, abstractmethod


class SleepModeBackend(ABC):
    def __init__(self):
        self._state = "RUNNING"

    @abstractmethod
    def suspend(self, level=1):
        raise NotImplementedError

    @abstractmethod
    def resume(self, tags=None):
        raise NotImplementedError

    def state(self):
        return self._state

    @classmethod
    def is_supported(cls):
        return True

    @classmethod
    def preserves_communicators(cls):
        return False

    @classmethod
    def preserves_compiled_artifacts(cls):
        return False

    @classmethod
    def preserves_graphs_with_communicators(cls):
        return False

    @classmethod
    def supports_durable_storage(cls):
        return False


class CuMemBackend(SleepModeBackend):
    def suspend(self, level=1):
        from vllm.device_allocator import get_mem_allocator_instance
        self._state = "SUSPENDED"
        get_mem_allocator_instance().sleep(offload_tags=("weights",) if level == 1 else tuple())

    def resume(self, tags=None):
        from vllm.device_allocator import get_mem_allocator_instance
        self._state = "RESUMING"
        get_mem_allocator_instance().wake_up(tags)
        self._state = "RUNNING"


class SleepModeBackendFactory:
    _registry = {}

    @classmethod
    def register_backend(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Sleep-mode backend '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def get_backend_class(cls, name):
        if name not in cls._registry:
            raise ValueError(f"Unsupported sleep-mode backend '{name}'. "
                             f"Registered backends: {', '.join(sorted(cls._registry))}.")
        return cls._registry[name]()

    @classmethod
    def create_backend(cls, model_config):
        backend_cls = cls.get_backend_class(model_config.sleep_mode_backend)
        if not backend_cls.is_supported():
            raise ValueError(f"Sleep-mode backend '{model_config.sleep_mode_backend}' is not supported")
        return backend_cls()


SleepModeBackendFactory.register_backend("cumem", __name__, "CuMemBackend")
