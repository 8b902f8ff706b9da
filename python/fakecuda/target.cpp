// The target GPU as the CUDA runtime describes it: count, properties, attributes, versions,
// errors (fakecuda.h). Values come from CACHET_FAKE_* (cachet predict's GPU table); the ones no
// table gives are those of a Hopper part, and a query the table does not answer is written to the
// ledger once.
#include "fakecuda.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

namespace cachet::fakecuda {
namespace {
std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}
Target load_target() {
  Target t;
  if (const char* n = std::getenv("CACHET_FAKE_GPU_NAME"); n && *n) t.name = n;
  t.total_memory = env_u64("CACHET_FAKE_GPU_MEMORY", t.total_memory);
  t.outside_allocator = env_u64("CACHET_FAKE_OUTSIDE_ALLOCATOR", t.outside_allocator);
  if (const char* a = std::getenv("CACHET_FAKE_GPU_ARCH"); a && std::strlen(a) >= 2) {
    int cc = std::atoi(a);
    t.major = cc / 10;
    t.minor = cc % 10;
  }
  t.sm_count = static_cast<int>(env_u64("CACHET_FAKE_GPU_SMS", static_cast<std::uint64_t>(t.sm_count)));
  t.shared_per_block_optin = static_cast<int>(env_u64("CACHET_FAKE_GPU_SMEM_OPTIN", static_cast<std::uint64_t>(t.shared_per_block_optin)));
  t.shared_per_sm = t.shared_per_block_optin + 1024;
  t.l2_bytes = static_cast<int>(env_u64("CACHET_FAKE_GPU_L2", static_cast<std::uint64_t>(t.l2_bytes)));
  t.pci_device_id = static_cast<int>(env_u64("CACHET_FAKE_GPU_PCI_ID", static_cast<std::uint64_t>(t.pci_device_id)));
  if (t.major < 8) t.max_blocks_per_sm = 16;
  if (t.major == 8 && t.minor != 0) t.max_threads_per_sm = 1536;
  return t;
}
std::mutex ledger_mutex;
std::set<std::string>& ledger_keys() { static std::set<std::string> k; return k; }
thread_local int current_device = 0;
// cuOccupancyMaxActiveClusters as the project's H200 answered it for clusters of 1..32 blocks at
// one block an SM: the queries of cuDNN's hardware detection (PyTorch 2.11, CUDA 13.0, 2026-12-02;
// docs/predict.md section 3). Seven of its GPCs hold a cluster of 16 SMs, two one of 18.
constexpr int kMeasuredH200Clusters[33] = {0,   132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7,
                                           2,   2,   0,  0,  0,  0,  0,  0,  0,  0, 0, 0, 0, 0, 0, 0};
}  // namespace

int active_clusters(int cluster_sms) {
  const Target& t = target();
  if (cluster_sms <= 0) return 0;
  if (cluster_sms == 1) return t.sm_count;
  if (t.major == 9 && t.sm_count == 132)
    return cluster_sms < 33 ? kMeasuredH200Clusters[cluster_sms] : 0;
  // Other parts, not measured: eight GPCs of equal size (ledger), at most 16 SMs a cluster.
  ledger_once("clusters", "default\tthread-block clusters: the SMs taken as 8 equal GPCs, 16 SMs a cluster at most");
  if (cluster_sms > 16) return 0;
  return 8 * ((t.sm_count / 8) / cluster_sms);
}

const Target& target() {
  static const Target t = load_target();
  return t;
}

void ledger(const std::string& line) {
  static const char* path = std::getenv("CACHET_FAKE_LEDGER");
  if (!path || !*path) return;
  std::lock_guard<std::mutex> g(ledger_mutex);
  std::ofstream(path, std::ios::app) << line << '\n';
}
void ledger_once(const std::string& key, const std::string& line) {
  {
    std::lock_guard<std::mutex> g(ledger_mutex);
    if (!ledger_keys().insert(key).second) return;
  }
  ledger(line);
}
bool trace_calls() {
  static const bool on = std::getenv("CACHET_FAKE_TRACE") != nullptr;
  return on;
}
void* new_handle() {
  static std::atomic<std::uintptr_t> next{0x1000};
  return reinterpret_cast<void*>(next.fetch_add(0x10));
}
}  // namespace cachet::fakecuda

using namespace cachet::fakecuda;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int* v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) { *can = 0; return cudaSuccess; }
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned int) { return cudaErrorInvalidDevice; }
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int) {
  std::snprintf(bus, static_cast<size_t>(len), "0000:00:00.0");
  return cudaSuccess;
}
cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorInvalidValue: return "invalid argument";
    default: return "unknown error (cachet's fake CUDA device)";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  const Target& t = target();
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "%s", t.name.c_str());
  for (int i = 0; i < 16; ++i) p->uuid.bytes[i] = static_cast<char>(0xca + i);
  p->totalGlobalMem = t.total_memory;
  p->sharedMemPerBlock = 49152;
  p->regsPerBlock = t.regs_per_block;
  p->warpSize = 32;
  p->memPitch = 2147483647;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = t.major;
  p->minor = t.minor;
  p->textureAlignment = 512;
  p->texturePitchAlignment = 32;
  p->multiProcessorCount = t.sm_count;
  p->integrated = 0;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->pciBusID = 0;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->memoryBusWidth = t.bus_width;
  p->l2CacheSize = t.l2_bytes;
  p->persistingL2CacheMaxSize = t.l2_bytes / 2;
  p->maxThreadsPerMultiProcessor = t.max_threads_per_sm;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->localL1CacheSupported = 1;
  p->sharedMemPerMultiprocessor = static_cast<size_t>(t.shared_per_sm);
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  p->hostNativeAtomicSupported = 0;
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = static_cast<size_t>(t.shared_per_block_optin);
  p->maxBlocksPerMultiProcessor = t.max_blocks_per_sm;
  p->accessPolicyMaxWindowSize = 134213632;
  p->reservedSharedMemPerBlock = 1024;
  p->hostRegisterSupported = 1;
  p->memoryPoolsSupported = 1;
  p->gpuDirectRDMASupported = 0;
  p->unifiedFunctionPointers = 1;
  return cudaSuccess;
}

// Every attribute of cudaDeviceAttr 0..147 as the project's H200 answered it (cudaDeviceGetAttribute,
// PyTorch 2.11 / CUDA 13.0, 2026-12-02), PCI identity left 0 (answered from the target below): the answer for an attribute the
// target does not set below. NVIDIA's cuDNN reads many of them to rank its engines (docs/predict.md
// section 3).
constexpr int kMeasuredH200[148] = {
    0, 1024, 1024, 1024, 64, 2147483647, 65535, 65535,
    49152, 65536, 32, 2147483647, 65536, 1980000, 512, 1,
    132, 0, 0, 1, 0, 131072, 131072, 65536,
    16384, 16384, 16384, 32768, 32768, 2048, 512, 1,
    1, 0, 0, 0, 3201000, 6016, 62914560, 2048,
    3, 1, 32768, 2048, 1, 32768, 32768, 8192,
    8192, 32768, 0, 32, 32768, 32768, 2046, 32768,
    131072, 65536, 16384, 16384, 16384, 32768, 2048, 32768,
    32768, 2048, 32768, 32768, 2046, 268435456, 131072, 65000,
    2097120, 32768, 32768, 9, 0, 32768, 1, 1,
    1, 233472, 65536, 1, 0, 0, 0, 2,
    0, 1, 1, 1, 0, 0, 0, 1,
    1, 232448, 0, 1, 0, 0, 1, 1,
    0, 0, 32, 1, 39321600, 134217728, 1, 1024,
    1, 1, 1, 1, 1, 1, 100, 9,
    1, 1, 1, 1, 1, 1, 4, 1,
    1, 1, 0, -1, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 1, 1, 0,
    1, 1, 0, 0,
};
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  const Target& t = target();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 49152; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = t.regs_per_block; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = 65536; break;
    case cudaDevAttrClockRate: *value = t.clock_khz; break;
    case cudaDevAttrMemoryClockRate: *value = t.mem_clock_khz; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = t.bus_width; break;
    case cudaDevAttrMultiProcessorCount: *value = t.sm_count; break;
    case cudaDevAttrIntegrated: *value = 0; break;
    case cudaDevAttrL2CacheSize: *value = t.l2_bytes; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = t.max_threads_per_sm; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = t.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = t.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = t.shared_per_sm; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = t.shared_per_block_optin; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = t.max_blocks_per_sm; break;
    case cudaDevAttrConcurrentManagedAccess: case cudaDevAttrManagedMemory: *value = 1; break;
    case cudaDevAttrPageableMemoryAccess: case cudaDevAttrPageableMemoryAccessUsesHostPageTables: *value = 0; break;
    case cudaDevAttrHostRegisterSupported: case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrGPUDirectRDMASupported: *value = 0; break;
    case cudaDevAttrIpcEventSupport: *value = 1; break;
    case cudaDevAttrPciBusId: case cudaDevAttrPciDeviceId: case cudaDevAttrPciDomainId: *value = 0; break;
    // The chip's PCI ID and vendor: cuDNN reads it (the H200's measured subsystem beside it).
    case 139: *value = static_cast<int>((static_cast<unsigned>(t.pci_device_id) << 16) | 0x10DEu); break;
    case 140: *value = t.pci_device_id == 0x2335 ? 415174878 : 0x10DE; break;
    case cudaDevAttrConcurrentKernels: case cudaDevAttrCanMapHostMemory: case cudaDevAttrCooperativeLaunch: *value = 1; break;
    case cudaDevAttrTotalConstantMemory: *value = 65536; break;
    // Hopper and Ampere keep up to 5/8 and 3/4 of the L2 for persisting accesses.
    case cudaDevAttrMaxPersistingL2CacheSize: *value = t.major >= 9 ? t.l2_bytes / 8 * 5 : t.l2_bytes / 4 * 3; break;
    default:
      if (static_cast<int>(attr) >= 0 && static_cast<int>(attr) < 148) {
        *value = kMeasuredH200[static_cast<int>(attr)];
        break;
      }
      *value = 0;
      ledger_once("attr" + std::to_string(static_cast<int>(attr)),
                  "default\tcudaDeviceGetAttribute(" + std::to_string(static_cast<int>(attr)) + ") answered 0");
  }
  return cudaSuccess;
}

}  // extern "C"
