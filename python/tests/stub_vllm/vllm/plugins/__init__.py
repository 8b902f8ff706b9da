"""The stand-in's plug-in loading: every vllm.general_plugins entry point, called once."""
from importlib.metadata import entry_points

_loaded = False


def load_general_plugins():
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group="vllm.general_plugins"):
        ep.load()()
