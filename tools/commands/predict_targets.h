// tools/predict_targets.h: the GPUs `cachet predict --gpu NAME` knows (docs/predict.md section 2). Each
// entry is what the fake CUDA device tells the program: the total memory cudaMemGetInfo reports,
// compute capability, SM count, opt-in shared memory per block and L2 size. Where each total
// comes from is stated in its `source`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cachet::cli {

struct GpuTarget {
  std::string name;                  // as cudaGetDeviceProperties names it
  std::vector<std::string> spellings;  // accepted by --gpu (case and separators ignored)
  std::uint64_t total_memory = 0;    // cudaMemGetInfo's total
  int arch = 0;                      // compute capability x 10 (sm_90: 90)
  int sm_count = 0;
  int smem_optin = 0;                // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int l2_bytes = 0;
  std::string source;                // where total_memory comes from
  int pci_device_id = 0;             // the PCI device ID (vendor 0x10DE); cuDNN reads it
};

const std::vector<GpuTarget>& gpu_targets();
// The target --gpu names (spellings compared without case, spaces, '-' and '_'), or nullopt.
std::optional<GpuTarget> find_gpu(std::string_view text);
// "sm_90" / "sm90" / "90" / "9.0" -> 90; nullopt when not an architecture PyTorch 2.11 builds for.
std::optional<int> parse_arch(std::string_view text);
// The target for --device-memory BYTES --arch sm_XY: the SM count, shared memory and L2 of the
// table's first GPU of that architecture (said in `source`), else of a generic part.
GpuTarget custom_target(std::uint64_t device_memory, int arch);
// Every name and its spellings, one per line, for --help and for the unknown-GPU error.
std::string gpu_list_text();

// Memory the process uses on the device outside PyTorch's allocator (CUDA context, cuBLAS and
// cuDNN handles, loaded kernels): the median of total - free - reserved at the end of the eight
// suite programs of bench/predict on an H200, PyTorch 2.11, CUDA 13 (bench/predict/RESULTS.md).
inline constexpr std::uint64_t kOutsideAllocatorBytes = 804061184;

}  // namespace cachet::cli
