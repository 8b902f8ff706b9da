// The per-process part of PyTorch's out-of-memory message, as the native allocator writes it
// (reportProcessMemoryInfo in c10/cuda/CUDACachingAllocator.cpp): NVML's compute processes on the
// device, "Including non-PyTorch memory, this process has X memory in use. " for this process and
// "Process N has X memory in use. " for each other one, in NVML's order. Empty where torch's
// DriverAPI finds no NVML (native writes nothing there either).
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace cachet::c10_backend {

std::string process_memory_info(c10::DeviceIndex device);

// `message` (cachet's OOM text, PyTorch's words) with process_memory_info(device) put where
// native puts it: right after "... of which X is free. ". Unchanged when there is nothing to add
// or no such place (the "more than 1EB" message).
std::string with_process_memory_info(const std::string& message, c10::DeviceIndex device);

}  // namespace cachet::c10_backend
