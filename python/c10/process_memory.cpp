// See process_memory.h. NVML is opened at run time (libnvidia-ml.so.1, as torch's DriverAPI opens
// it) with the four entry points native uses declared here, so the library never links
// libnvidia-ml or libcuda and builds without nvml.h (not every CUDA Toolkit install has it).
#include "c10/process_memory.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "cachet/summary.h"

namespace cachet::c10_backend {
namespace {

// NVML's ABI, as nvml.h declares it (the unversioned, v1 process query native calls).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
#define NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"

struct Nvml {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*procs)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v1_t*) = nullptr;
  bool ok = false;
};

const Nvml& nvml() {
  static const Nvml n = [] {
    Nvml r;
    void* h = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
    if (h == nullptr) return r;
    r.init = reinterpret_cast<decltype(r.init)>(dlsym(h, "nvmlInit_v2"));
    r.by_pci = reinterpret_cast<decltype(r.by_pci)>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
    r.procs = reinterpret_cast<decltype(r.procs)>(dlsym(h, "nvmlDeviceGetComputeRunningProcesses"));
    r.ok = r.init && r.by_pci && r.procs && r.init() == NVML_SUCCESS;
    return r;
  }();
  return n;
}

}  // namespace

std::string process_memory_info(c10::DeviceIndex device) {
  const Nvml& n = nvml();
  if (!n.ok) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  char pci_id[80];
  std::snprintf(pci_id, sizeof(pci_id), NVML_DEVICE_PCI_BUS_ID_FMT, prop.pciDomainID, prop.pciBusID,
                prop.pciDeviceID);
  nvmlDevice_t nvml_device = nullptr;
  if (n.by_pci(pci_id, &nvml_device) != NVML_SUCCESS) return "";
  std::vector<nvmlProcessInfo_v1_t> procs(8);
  unsigned int size = static_cast<unsigned int>(procs.size());
  nvmlReturn_t r{};
  while ((r = n.procs(nvml_device, &size, procs.data())) ==
         NVML_ERROR_INSUFFICIENT_SIZE) {
    procs.resize(size);
  }
  if (r != NVML_SUCCESS) return "";
  const auto self = static_cast<unsigned int>(getpid());
  std::string out;
  for (unsigned int i = 0; i < size; ++i) {
    out += procs[i].pid == self ? std::string("Including non-PyTorch memory, this process")
                                : "Process " + std::to_string(procs[i].pid);
    out += " has " + cachet::format_size(procs[i].usedGpuMemory) + " memory in use. ";
  }
  return out;
}

std::string with_process_memory_info(const std::string& message, c10::DeviceIndex device) {
  static const std::string kAnchor = " is free. ";
  const auto at = message.find(kAnchor);
  if (at == std::string::npos) return message;
  // A backend that knows the process's memory already said it (one sentence, as native's).
  static const std::string kOwnSentence = "Including non-PyTorch memory, this process";
  if (message.compare(at + kAnchor.size(), kOwnSentence.size(), kOwnSentence) == 0) return message;
  const std::string info = process_memory_info(device);
  if (info.empty()) return message;
  std::string out = message;
  out.insert(at + kAnchor.size(), info);
  return out;
}

}  // namespace cachet::c10_backend
