// A fake CUDA device for `cachet predict` (docs/predict.md): libcachet_fakecuda.so is preloaded
// into an unmodified PyTorch program with no usable GPU and answers the CUDA runtime, the driver
// entry points PyTorch fetches through it, cuBLAS(Lt) and cuDNN as the target GPU would, except
// that no kernel runs and device memory holds no data. PyTorch's own caching allocator runs on top
// of it unchanged, so every allocation, free, stream use, workspace and out-of-memory error is
// PyTorch's own; `_record_memory_history` records them as on the GPU.
//
// Glossary:
//   target      the GPU being predicted (CACHET_FAKE_* environment, written by cachet predict)
//   device VA   addresses handed out for device memory: a PROT_NONE reservation, never backed,
//               so a host access to a device pointer faults instead of reading garbage
//   placeholder what a copy from the device to the host writes: zero bytes (docs/predict.md section 4)
//   ledger      a text file (CACHET_FAKE_LEDGER) where the fake device writes what the capture
//               cannot see in the trace: workspaces set on cuBLAS handles, modelled cuDNN
//               workspaces, queries it answered with a default
//
// Invariants:
//   F1 device bytes in use = sum of live cudaMalloc sizes + live cuMemCreate sizes
//   F2 an allocation that would take device bytes in use past (total - outside_allocator) fails
//      with cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY, as the driver does
//   F3 every stream, event and graph handle is distinct and never null
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cachet::fakecuda {

struct Target {
  std::string name = "NVIDIA H200";
  std::uint64_t total_memory = 150121086976ULL;   // what cudaMemGetInfo reports as total
  std::uint64_t outside_allocator = 0;            // context and other non-allocator memory
  int major = 9, minor = 0, sm_count = 132;
  int shared_per_block_optin = 232448, shared_per_sm = 233472;
  int l2_bytes = 52428800, clock_khz = 1980000, mem_clock_khz = 3201000, bus_width = 6016;
  int max_threads_per_sm = 2048, regs_per_block = 65536, max_blocks_per_sm = 32;
  int pci_device_id = 0x2335;  // cudaDevAttr 139 answers (pci_device_id << 16) | 0x10DE
};

const Target& target();
// F1/F2: take or give back device bytes; false when the target is full.
bool take_device_bytes(std::uint64_t n);
void give_device_bytes(std::uint64_t n);
std::uint64_t device_bytes_in_use();
// Device VA: a range for n bytes aligned to align (never reused while live).
std::uintptr_t reserve_va(std::uint64_t n, std::uint64_t align);
void release_va(std::uintptr_t p);
bool is_device_pointer(const void* p);
std::uint64_t device_allocation_size(const void* p);  // 0 when p is not a live cudaMalloc base
// A fresh, distinct, non-null handle (F3).
void* new_handle();
// The target's one context, the primary one: the same non-null handle wherever a context is
// answered (the runtime's, the driver's, a pointer's, a stream's).
inline void* primary_context() { return reinterpret_cast<void*>(std::uintptr_t{0xc0de}); }
// The fake driver's function for a driver API name (cuGetProcAddress, cudaGetDriverEntryPoint*):
// every name has one; those not modelled answer CUDA_SUCCESS and are written to the ledger.
void* driver_entry(const char* symbol);
// The driver functions a statically linked CUDA runtime needs beyond PyTorch's (driver_static.cpp),
// or null.
void* static_runtime_entry(const char* symbol);
// Thread-block clusters (sm_90 and later): how many clusters of `cluster_sms` SMs, each with at
// least one block, run at once (target.cpp).
int active_clusters(int cluster_sms);
// cuGetExportTable (export_tables.cpp).
void* export_table_entry();
// MD2 (RFC 1319) and HMAC-MD2 with a 16-byte key (md2.cpp).
void md2(const std::string& message, unsigned char out[16]);
void hmac_md2(const unsigned char key[16], const std::string& message, unsigned char out[16]);
// One line to the ledger (no-op without CACHET_FAKE_LEDGER).
void ledger(const std::string& line);
void ledger_once(const std::string& key, const std::string& line);
// Calls to the fake device, counted, for --verbose diagnosis.
bool trace_calls();

}  // namespace cachet::fakecuda
