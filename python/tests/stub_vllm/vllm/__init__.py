"""A stand-in for vLLM, written for cachet's tests from the signatures of vLLM PR #44074 (pluggable
sleep-mode backends) and vLLM's CuMemAllocator interface; it is not vLLM's code. It holds what a
sleep-mode backend plug-in meets: vllm.device_allocator (get_mem_allocator_instance, CuMemAllocator),
vllm.device_allocator.sleep_mode_backend (SleepModeBackend, SleepModeBackendFactory, the built-in
"cumem" backend) and vllm.plugins.load_general_plugins() (the vllm.general_plugins entry points)."""
