// cachet/model/segment_source.h: where device addresses come from.
//
// The model decides every size; a SegmentSource only hands out base addresses and answers the
// driver's questions (capacity, free memory). Two implementations:
//   SyntheticSegmentSource  deterministic addresses and a configurable capacity; requests beyond
//                           it fail like cudaMalloc's out-of-memory.
//   RecordedSegmentSource   exactly the addresses PyTorch's driver returned in a recording, in
//                           order. A size that differs from the recorded one is a Divergence,
//                           never corrected from the recording.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::model {

// The model asked the device for something the recording shows differently. The replay that
// catches it adds the op index.
class Divergence : public std::runtime_error {
 public:
  Divergence(std::string what, std::string expected, std::string actual)
      : std::runtime_error(what + ": expected " + expected + ", got " + actual),
        expected_(std::move(expected)),
        actual_(std::move(actual)) {}
  const std::string& expected() const { return expected_; }
  const std::string& actual() const { return actual_; }

 private:
  std::string expected_;
  std::string actual_;
};

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // cudaMalloc(size): a base address, or nullopt for cudaErrorMemoryAllocation.
  virtual std::optional<std::uint64_t> allocate(Bytes size) = 0;
  // cudaFree.
  virtual void free(std::uint64_t addr, Bytes size) = 0;
  // cuMemAddressReserve(size) for a new expandable segment: its base.
  virtual std::uint64_t reserve(Bytes size) = 0;
  virtual void release_reservation(std::uint64_t base, Bytes size) = 0;
  // cuMemCreate + cuMemMap of [addr, addr + size): false for CUDA_ERROR_OUT_OF_MEMORY.
  virtual bool map(std::uint64_t addr, Bytes size) = 0;
  virtual void unmap(std::uint64_t addr, Bytes size) = 0;
  // cudaMemGetInfo / totalGlobalMem.
  virtual Bytes total_memory() const = 0;
  virtual Bytes free_memory() const = 0;
  // NVML's figure for this process ("this process has X memory in use"); nullopt = unknown.
  virtual std::optional<Bytes> process_in_use() const { return std::nullopt; }
};

// Deterministic: cudaMalloc addresses count up from 0x7f0000000000 (2 MiB aligned, never
// reused), reservations from 0x300000000. Memory in use = allocated + mapped bytes; a request
// that would exceed `capacity` fails.
class SyntheticSegmentSource final : public SegmentSource {
 public:
  explicit SyntheticSegmentSource(Bytes capacity = 80 * GiB, Bytes total = 0);
  std::optional<std::uint64_t> allocate(Bytes size) override;
  void free(std::uint64_t addr, Bytes size) override;
  std::uint64_t reserve(Bytes size) override;
  void release_reservation(std::uint64_t base, Bytes size) override;
  bool map(std::uint64_t addr, Bytes size) override;
  void unmap(std::uint64_t addr, Bytes size) override;
  Bytes total_memory() const override { return total_; }
  Bytes free_memory() const override { return capacity_ - in_use_; }
  std::optional<Bytes> process_in_use() const override { return in_use_; }
  Bytes in_use() const { return in_use_; }

 private:
  Bytes capacity_;
  Bytes total_;
  Bytes in_use_ = 0;
  std::uint64_t next_segment_ = 0x7f0000000000;
  std::uint64_t next_reservation_ = 0x300000000;
};

// Replays a recording's device events. `events` is the recording's trace; only segment_alloc,
// segment_free, segment_map and segment_unmap rows are used, in order:
//   allocate(size)  takes the next segment_alloc row; its size must equal `size`.
//   reserve(size)   the base of a new reservation is the address of the next segment_map row
//                   (the allocator maps a new reservation from its lowest address:
//                   docs/pytorch-allocator.md §7).
//   map(addr,size)  takes the next segment_map row; address and size must match.
//   free / unmap    take the next segment_free / segment_unmap row; must match.
// Running past the recorded rows is a Divergence too.
class RecordedSegmentSource final : public SegmentSource {
 public:
  RecordedSegmentSource(const std::vector<TraceEvent>& events, Bytes total_memory);
  std::optional<std::uint64_t> allocate(Bytes size) override;
  void free(std::uint64_t addr, Bytes size) override;
  std::uint64_t reserve(Bytes size) override;
  void release_reservation(std::uint64_t, Bytes) override {}
  bool map(std::uint64_t addr, Bytes size) override;
  void unmap(std::uint64_t addr, Bytes size) override;
  Bytes total_memory() const override { return total_; }
  // The recording does not carry the driver's figures; the replay masks them in OOM messages.
  Bytes free_memory() const override { return total_ > in_use_ ? total_ - in_use_ : 0; }
  std::optional<Bytes> process_in_use() const override { return in_use_; }

 private:
  struct Row {
    std::uint64_t addr;
    Bytes size;
  };
  const Row& take(std::vector<Row>& rows, std::size_t& cursor, const char* what);
  std::vector<Row> allocs_, frees_, maps_, unmaps_;
  std::size_t alloc_i_ = 0, free_i_ = 0, map_i_ = 0, unmap_i_ = 0;
  Bytes total_;
  Bytes in_use_ = 0;
};

}  // namespace cachet::model
