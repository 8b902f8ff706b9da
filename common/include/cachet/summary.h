// cachet/summary.h: PyTorch's human-readable texts, byte for byte: torch.cuda.memory_summary()
// and the CUDA out-of-memory message.
#pragma once

#include <optional>
#include <string>

#include "cachet/stats.h"
#include "cachet/types.h"

namespace cachet {

// torch.cuda.memory_summary(device, abbreviated) for these stats.
std::string memory_summary(const DeviceStats& s, DeviceIndex device = 0, bool abbreviated = false);

// cachet's lines about sleeping memory (docs/sleep-wake.md, section 5), printed after PyTorch's summary
// by the Python bindings: "" when nothing ever slept (num_sleeps == 0), so that memory_summary
// stays PyTorch's text byte for byte; else
//   "Sleeping: <n> segments, <size> (<size> of it allocated); host backups: <size>\n"
// with format_size's sizes, then "Sleeps: <n>, wakes: <n>, wakes out of memory: <n>\n".
std::string sleep_summary(const SleepStats& s);

// PyTorch's format_size (c10/util): "N bytes", "x.xx KiB", "x.xx MiB", "x.xx GiB".
std::string format_size(Bytes bytes);

// The facts the OOM message states. The driver figures (total, free, process in-use) come from
// the device interface; process_in_use is omitted when unknown (no NVML).
struct OomFacts {
  Bytes alloc_size = 0;  // the segment size that was asked of the device
  DeviceIndex device = 0;
  Bytes device_total = 0;
  Bytes device_free = 0;
  std::optional<Bytes> process_in_use;     // "Including non-PyTorch memory, this process has ..."
  std::optional<Bytes> allowed;            // memory cap, when a fraction is set
  Bytes allocated = 0;                     // allocated_bytes.all.current
  Bytes reserved = 0;                      // reserved_bytes.all.current
  Bytes private_pool_free = 0;             // free bytes in private pools (CUDA graphs)
  friend bool operator==(const OomFacts&, const OomFacts&) = default;
};

// "CUDA out of memory. Tried to allocate ..." exactly as PyTorch 2.11 words it. An alloc_size of
// kMaxRequest (1 EiB) or more gets PyTorch's short form, "Tried to allocate more than 1EB memory."
std::string oom_message(const OomFacts& f);

}  // namespace cachet
