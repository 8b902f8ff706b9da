// The front end's allocator calls for each pool and capture op, written out by hand from
// docs/pytorch-allocator.md §14.9 (and §14.4's use counts), against a recording fake allocator.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/front_end/pool_front_end.h"

namespace cachet::front_end {
namespace {

std::string id(PoolId p) { return fmt::format("{{{},{}}}", p.first, p.second); }

// Logs every call; malloc hands out 0x1000, 0x2000, ...; `fail_malloc_at` (1-based call count)
// throws OutOfMemory; begin_allocate_to_pool refuses a pool already active, as PyTorch does.
class FakeCalls final : public AllocatorCalls {
 public:
  std::vector<std::string> log;
  int fail_malloc_at = 0;

  std::uint64_t malloc(Bytes size, StreamId stream) override {
    if (++mallocs_ == fail_malloc_at) {
      log.push_back(fmt::format("malloc {} s{} -> OOM", size, stream));
      throw OutOfMemory("out of memory");
    }
    next_ += 0x1000;
    log.push_back(fmt::format("malloc {} s{} -> {:#x}", size, stream, next_));
    return next_;
  }
  void free(std::uint64_t ptr) override { log.push_back(fmt::format("free {:#x}", ptr)); }
  void create_or_incref_pool(PoolId p) override {
    log.push_back("create " + id(p));
    ++use_[p];
  }
  void begin_allocate_to_pool(PoolId p, PoolRoute r) override {
    if (active_.contains(p)) throw UsageError("already recording to " + id(p));
    log.push_back("begin " + id(p) + (r.is_capture() ? fmt::format(" stream {}", r.stream) : std::string(" thread")));
    active_.insert(p);
    ++use_[p];
  }
  void end_allocate_to_pool(PoolId p) override {
    log.push_back("end " + id(p));
    active_.erase(p);
  }
  void release_pool(PoolId p) override {
    log.push_back("release " + id(p));
    --use_[p];
  }
  void empty_cache_of(PoolId p) override { log.push_back("empty_cache " + id(p)); }
  int pool_use_count(PoolId p) const override { return use_.at(p); }
  std::vector<std::string> take() { return std::exchange(log, {}); }

 private:
  int mallocs_ = 0;
  std::uint64_t next_ = 0;
  std::set<PoolId> active_;
  std::map<PoolId, int> use_;
};

using V = std::vector<std::string>;

TEST(PoolFrontEnd, MemPoolEnteredLeftAndDropped) {
  FakeCalls f;
  PoolFrontEnd fe(f);
  fe.apply(ops::UseMemPoolBegin{3});  // MemPool() then use_mem_pool enter
  EXPECT_EQ(f.take(), (V{"create {0,1}", "begin {0,1} thread"}));
  EXPECT_TRUE(fe.underway());
  EXPECT_EQ(fe.live_pools().at(0).use_count, 2);  // the MemPool and its use_mem_pool (§14.4)
  EXPECT_THROW(fe.apply(ops::UseMemPoolBegin{3}), UsageError);
  EXPECT_THROW(fe.apply(ops::ReleasePool{3}), UsageError);  // still in use
  EXPECT_TRUE(f.take().empty());
  fe.apply(ops::UseMemPoolEnd{3});
  EXPECT_EQ(f.take(), (V{"end {0,1}", "release {0,1}"}));
  EXPECT_FALSE(fe.underway());
  fe.apply(ops::UseMemPoolBegin{3});  // the same MemPool again: no new id
  fe.apply(ops::UseMemPoolEnd{3});
  EXPECT_EQ(f.take(), (V{"begin {0,1} thread", "end {0,1}", "release {0,1}"}));
  EXPECT_EQ(fe.live_pools().at(0).use_count, 1);
  fe.apply(ops::ReleasePool{3});  // ~MemPool
  EXPECT_EQ(f.take(), (V{"release {0,1}", "empty_cache {0,1}"}));
  EXPECT_TRUE(fe.live_pools().empty());
  EXPECT_THROW(fe.apply(ops::UseMemPoolEnd{3}), UsageError);
  EXPECT_THROW(fe.apply(ops::ReleasePool{3}), UsageError);
  fe.apply(ops::UseMemPoolBegin{3});  // a new MemPool under the same k: the next id
  EXPECT_EQ(f.take(), (V{"create {0,2}", "begin {0,2} thread"}));
  ASSERT_EQ(fe.pool_ids().size(), 2u);
  EXPECT_EQ(fe.pool_ids()[1].name, "3");
  EXPECT_EQ(fe.pool_ids()[1].id, (PoolId{0, 2}));
}

TEST(PoolFrontEnd, GraphsShareAPoolAndTheGeneratorTensorsLiveWhileAnyIsRegistered) {
  FakeCalls f;
  PoolFrontEnd fe(f);
  fe.apply(ops::CaptureBegin{0, 1, std::nullopt});
  EXPECT_EQ(f.take(), (V{"malloc 8 s1 -> 0x1000", "malloc 8 s1 -> 0x2000", "begin {1,0} stream 1"}));
  EXPECT_EQ(fe.graph(0), PoolFrontEnd::GraphState::Capturing);
  EXPECT_THROW(fe.apply(ops::CaptureBegin{1, 2, 0}), UsageError);  // graph 0 has not finished
  EXPECT_THROW(fe.apply(ops::GraphReset{0}), UsageError);          // still capturing
  EXPECT_TRUE(f.take().empty());
  fe.apply(ops::CaptureEnd{0});
  EXPECT_EQ(f.take(), (V{"end {1,0}"}));
  fe.apply(ops::CaptureBegin{1, 2, 0});  // pool=g0.pool(): no new id, no generator tensors
  fe.apply(ops::CaptureEnd{1});
  fe.apply(ops::CaptureBegin{2, 1, std::nullopt});
  EXPECT_EQ(f.take(), (V{"begin {1,0} stream 2", "end {1,0}", "begin {2,0} stream 1"}));
  fe.apply(ops::CaptureEnd{2});
  fe.apply(ops::GraphReset{0});
  fe.apply(ops::GraphReset{2});
  EXPECT_EQ(f.take(), (V{"end {2,0}", "release {1,0}", "release {2,0}"}));
  fe.apply(ops::GraphReset{1});  // the last registered graph: seed, then offset
  EXPECT_EQ(f.take(), (V{"release {1,0}", "free 0x1000", "free 0x2000"}));
  EXPECT_THROW(fe.apply(ops::GraphReset{1}), UsageError);
  EXPECT_THROW(fe.apply(ops::CaptureEnd{1}), UsageError);
  std::vector<std::string> names;
  for (const auto& p : fe.pool_ids()) names.push_back(p.name + id(p.id));
  EXPECT_EQ(names, (V{"g0{1,0}", "g1{1,0}", "g2{2,0}"}));
}

TEST(PoolFrontEnd, CaptureOnTheDefaultOrACapturingStreamIsRefusedBeforeAnyCall) {
  FakeCalls f;
  PoolFrontEnd fe(f);
  EXPECT_THROW(fe.apply(ops::CaptureBegin{0, 0, std::nullopt}), UsageError);
  EXPECT_TRUE(f.take().empty());
  fe.apply(ops::CaptureBegin{0, 1, std::nullopt});
  f.take();
  EXPECT_THROW(fe.apply(ops::CaptureBegin{1, 1, std::nullopt}), UsageError);
  EXPECT_TRUE(f.take().empty());
  fe.apply(ops::CaptureBegin{1, 2, std::nullopt});  // another stream may capture meanwhile
  EXPECT_EQ(f.take(), (V{"begin {2,0} stream 2"}));
  EXPECT_TRUE(fe.underway());
}

TEST(PoolFrontEnd, RecordingStreamIndices) {
  FakeCalls f;
  const std::vector<StreamId> streams{0, 0x55, 0x66};
  PoolFrontEnd fe(f, &streams);
  fe.apply(ops::CaptureBegin{0, 2, std::nullopt});
  EXPECT_EQ(f.take(), (V{"malloc 8 s102 -> 0x1000", "malloc 8 s102 -> 0x2000", "begin {1,0} stream 102"}));
  EXPECT_EQ(fe.capture_stream(0), StreamId{0x66});
  EXPECT_THROW(fe.apply(ops::CaptureBegin{1, 3, std::nullopt}), std::invalid_argument);
}

TEST(PoolFrontEnd, OutOfMemoryForTheOffsetKeepsTheSeedUntilTheNextRegistration) {
  FakeCalls f;
  f.fail_malloc_at = 2;
  PoolFrontEnd fe(f);
  EXPECT_THROW(fe.apply(ops::CaptureBegin{0, 1, std::nullopt}), OutOfMemory);
  EXPECT_EQ(f.take(), (V{"malloc 8 s1 -> 0x1000", "malloc 8 s1 -> OOM"}));
  EXPECT_EQ(fe.graph(0), PoolFrontEnd::GraphState::None);
  EXPECT_FALSE(fe.underway());
  // The next registration allocates a seed, drops the held one, allocates the offset; the pool
  // id {1, 0} was not used by the failed capture.
  fe.apply(ops::CaptureBegin{0, 1, std::nullopt});
  EXPECT_EQ(f.take(), (V{"malloc 8 s1 -> 0x2000", "free 0x1000", "malloc 8 s1 -> 0x3000", "begin {1,0} stream 1"}));
}

TEST(PoolFrontEnd, ARefusedBeginUnregistersTheGraph) {
  FakeCalls f;
  PoolFrontEnd fe(f);
  fe.apply(ops::CaptureBegin{0, 1, std::nullopt});
  fe.apply(ops::CaptureEnd{0});
  fe.apply(ops::CaptureBegin{1, 1, 0});  // graph 1 captures into graph 0's pool
  f.take();
  // Graph 2 also asks for that pool while graph 1 still captures into it: the allocator refuses.
  EXPECT_THROW(fe.apply(ops::CaptureBegin{2, 2, 0}), UsageError);
  EXPECT_TRUE(f.take().empty());
  EXPECT_EQ(fe.graph(2), PoolFrontEnd::GraphState::None);
  fe.apply(ops::CaptureEnd{1});
  fe.apply(ops::GraphReset{1});
  fe.apply(ops::GraphReset{0});  // graph 2 is not registered: the last reset frees the tensors
  EXPECT_EQ(f.take(), (V{"end {1,0}", "release {1,0}", "release {1,0}", "free 0x1000", "free 0x2000"}));
}

}  // namespace
}  // namespace cachet::front_end
