// The RapidCheck commands and generators of the lockstep machine (props.h).
#include "props.h"

namespace cachet::props {
namespace {

struct AllocCmd : Cmd {
  Bytes size;
  int stream;
  ThreadIndex thread;  // docs/pytorch-allocator.md §14.10.2: a use_mem_pool takes its thread's only
  AllocCmd(Bytes s, int st, ThreadIndex t = 0) : size(s), stream(st), thread(t) {}
  void apply(PModel& m) const override { m.slots.push_back({size, stream, false}); }
  void run(const PModel& m, PSut& sut) const override {
    sut.step(lockstep::Allocate{size, sut.stream(stream), {}, thread}, m.slots.size());
  }
  void show(std::ostream& os) const override {
    os << "a: alloc " << size << " s" << stream << (thread != 0 ? " t" + std::to_string(thread) : "");
  }
};

struct FreeCmd : Cmd {
  std::size_t slot;
  explicit FreeCmd(std::size_t s) : slot(s) {}
  void checkPreconditions(const PModel& m) const override {
    const bool live = slot < m.slots.size() && !m.slots[slot].freed;  // RC_PRE does not short-circuit
    RC_PRE(live);
  }
  void apply(PModel& m) const override { m.slots[slot].freed = true; }
  void run(const PModel&, PSut& sut) const override {
    if (auto h = sut.handle(slot)) sut.step(lockstep::Free{*h});
  }
  void show(std::ostream& os) const override { os << "free a#" << slot; }
};

struct RecordCmd : Cmd {
  std::size_t slot;
  int stream;
  RecordCmd(std::size_t s, int st) : slot(s), stream(st) {}
  void checkPreconditions(const PModel& m) const override {
    const bool live = slot < m.slots.size() && !m.slots[slot].freed;  // RC_PRE does not short-circuit
    RC_PRE(live);
  }
  void run(const PModel&, PSut& sut) const override {
    if (auto h = sut.handle(slot)) sut.step(lockstep::RecordStream{*h, sut.stream(stream)});
  }
  void show(std::ostream& os) const override { os << "record a#" << slot << " s" << stream; }
};

struct CompleteCmd : Cmd {
  int stream;
  explicit CompleteCmd(int s) : stream(s) {}
  void run(const PModel&, PSut& sut) const override { sut.step(lockstep::CompleteEvents{sut.stream(stream)}); }
  void show(std::ostream& os) const override { os << "complete s" << stream; }
};

struct EmptyCacheCmd : Cmd {
  void run(const PModel&, PSut& sut) const override { sut.step(lockstep::EmptyCache{}); }
  void show(std::ostream& os) const override { os << "empty_cache"; }
};

// `fraction` of the capacity (props.h PSut::device_fraction: on a device larger than the
// capacity, the fraction of the device that gives the same cap in bytes).
struct FractionCmd : Cmd {
  double fraction;
  explicit FractionCmd(double f) : fraction(f) {}
  void run(const PModel&, PSut& sut) const override {
    sut.step(lockstep::SetMemoryFraction{sut.device_fraction(fraction)});
  }
  void show(std::ostream& os) const override { os << "fraction " << fraction; }
};

// tag, sleep, wake (docs/sleep-wake.md): the tag the runner's allocations get from here on;
// sleep(tags, backup_tags) and wake(tags), an empty list naming every tag (tags) or none (backup).
std::string show_tags(const TagList& l, const char* empty) {
  std::string r;
  for (const auto& t : l) r += (r.empty() ? "" : ",") + t;
  return r.empty() ? empty : r;
}

struct TagCmd : Cmd {
  std::string tag;
  explicit TagCmd(std::string t) : tag(std::move(t)) {}
  void apply(PModel& m) const override { m.sleep.tag = tag; }
  void run(const PModel&, PSut& sut) const override { sut.step(ops::SetTag{tag}); }
  void show(std::ostream& os) const override { os << "tag " << tag; }
};

struct SleepCmd : Cmd {
  TagList tags, backup;
  SleepCmd(TagList t, TagList b) : tags(std::move(t)), backup(std::move(b)) {}
  void run(const PModel&, PSut& sut) const override { sut.step(ops::Sleep{tags, backup}); }
  void show(std::ostream& os) const override {
    os << "sleep tags " << show_tags(tags, "all") << " backup " << show_tags(backup, "none");
  }
};

struct WakeCmd : Cmd {
  TagList tags;
  explicit WakeCmd(TagList t) : tags(std::move(t)) {}
  void run(const PModel&, PSut& sut) const override { sut.step(ops::Wake{tags}); }
  void show(std::ostream& os) const override { os << "wake tags " << show_tags(tags, "all"); }
};

// A subset of kTagNames in their order; `empty` in 1 of 4 (every tag / none).
TagList gen_tags() {
  if (*rc::gen::inRange(0, 4) == 0) return {};
  TagList r;
  for (const auto& t : kTagNames)
    if (*rc::gen::inRange(0, 2) == 0) r.push_back(t);
  if (r.empty()) r.push_back(*rc::gen::elementOf(kTagNames));
  return r;
}

// ------------------------------------------------------------------------------- generators

rc::Gen<Bytes> near(Bytes x) {
  return rc::gen::map(rc::gen::inRange<std::int64_t>(-1536, 1537), [x](std::int64_t d) {
    const std::int64_t v = static_cast<std::int64_t>(x) + d;
    return static_cast<Bytes>(std::max<std::int64_t>(1, v));
  });
}

rc::Gen<Bytes> gen_size(const Config& c) {
  const Bytes ms = c.max_split_size == kNoMaxSplit ? 64 * MiB : c.max_split_size;
  return rc::gen::weightedOneOf<Bytes>({
      {28, rc::gen::inRange<Bytes>(1, kSmallSize + 1)},                                  // small
      {26, rc::gen::inRange<Bytes>(kSmallSize + 1, 48 * MiB)},                           // large
      {5, near(512)},                                                                    // boundaries
      {5, near(kSmallSize)},
      {5, near(kMinLargeAlloc)},
      {6, near(ms)},                                                                     // max_split
      {10, rc::gen::inRange<Bytes>(ms, 3 * ms)},                                         // oversize
      {4, rc::gen::inRange<Bytes>(1 * GiB, 10 * GiB)},                                   // huge
      {1, rc::gen::element<Bytes>(0, kMaxRequest, kMaxRequest + 1)},                     // edge
  });
}

rc::Gen<double> gen_fraction() {
  return rc::gen::weightedOneOf<double>({
      {6, rc::gen::map(rc::gen::inRange(1, 60), [](int k) { return k / 1000.0; })},  // 8..480 MiB caps
      {2, rc::gen::map(rc::gen::inRange(60, 1001), [](int k) { return k / 1000.0; })},
      {2, rc::gen::just(1.0)},
  });
}

}  // namespace

std::shared_ptr<const Cmd> gen_sleep_command(const PModel&) {
  const int k = *rc::gen::inRange(0, 10);
  if (k < 4) return std::make_shared<TagCmd>(*rc::gen::elementOf(kTagNames));
  if (k < 7) return std::make_shared<SleepCmd>(gen_tags(), gen_tags());
  return std::make_shared<WakeCmd>(gen_tags());
}

rc::Gen<std::shared_ptr<const Cmd>> gen_command(const PModel& m) {
  return rc::gen::exec([m]() -> std::shared_ptr<const Cmd> {
    std::vector<std::size_t> live;
    for (std::size_t i = 0; i < m.slots.size(); ++i)
      if (!m.slots[i].freed) live.push_back(i);
    const int k = *rc::gen::inRange(0, 100);
    // Pool commands: 12 in 100, 25 while a graph captures where wait_stream and kernel are drawn
    // (they are pool commands: props_pools.cpp).
    bool capturing = false;
    for (const auto& [k, g] : m.pools.graphs) capturing = capturing || !g.ended;
    const int pool_share = capturing && kDrawStreamOps && g_policy == Policy::PyTorch ? 25 : 12;
    if (m.pools.enabled && *rc::gen::inRange(0, 100) < pool_share) return gen_pool_command(m);
    if (m.sleep.enabled && *rc::gen::inRange(0, 100) < 15) return gen_sleep_command(m);
    const auto stream = rc::gen::weightedOneOf<int>({{4, rc::gen::just(0)}, {3, rc::gen::inRange(1, kStreams)}});
    if (k < 45 || (live.empty() && k < 85)) {
      // With pools, one allocation in six is made by thread 1 or 2 (the thread filter). Not in
      // props_gpu_test yet: gpu/'s CUDA backends have not been run from fresh threads there.
      const ThreadIndex thread =
          kDrawThreads && m.pools.enabled && *rc::gen::inRange(0, 6) == 0 ? *rc::gen::inRange(1, 3) : 0;
      return std::make_shared<AllocCmd>(*gen_size(m.config), *stream, thread);
    }
    if (k < 78 && !live.empty()) return std::make_shared<FreeCmd>(*rc::gen::elementOf(live));
    if (k < 85 && !live.empty()) {
      // During a capture, half the uses go to a stream that joined it (what reuse during a
      // capture needs, docs/pytorch-allocator.md §14.10.1).
      std::vector<int> joined;
      for (const auto& [s, g] : m.pools.joined) joined.push_back(s);
      const int use = !joined.empty() && *rc::gen::inRange(0, 2) == 0 ? *rc::gen::elementOf(joined) : *stream;
      return std::make_shared<RecordCmd>(*rc::gen::elementOf(live), use);
    }
    if (k < 93) return std::make_shared<CompleteCmd>(*stream);
    if (k < 96) return std::make_shared<EmptyCacheCmd>();
    return std::make_shared<FractionCmd>(*gen_fraction());
  });
}

// A valid configuration, built as text (so it goes through parse_config like a user's).
// policy:cachet: "policy:cachet" and sometimes max_split_size_mb (under that policy the other
// keys change nothing but the max_split_size stat) and cachet_sleep.
rc::Gen<Config> gen_config() {
  if (g_policy == Policy::Cachet)
    return rc::gen::exec([]() {
      std::string text = "policy:cachet";
      if (*rc::gen::inRange(0, 3) == 0) text += ",max_split_size_mb:" + std::to_string(*rc::gen::inRange(20, 200));
      // Sleep and wake (docs/sleep-wake.md) in 1 of 3 cases (props.h sleep_supported).
      if (*rc::gen::inRange(0, 3) == 0) text += ",cachet_sleep:True";
      return parse_config(text).config;
    });
  return rc::gen::exec([]() {
    std::vector<std::string> parts;
    const std::uint64_t large_seg_mb = *rc::gen::weightedOneOf<std::uint64_t>(
        {{6, rc::gen::just<std::uint64_t>(20)}, {2, rc::gen::element<std::uint64_t>(12, 16, 32, 64)}});
    if (large_seg_mb != 20) parts.push_back("large_segment_size_mb:" + std::to_string(large_seg_mb));
    if (*rc::gen::inRange(0, 3) != 0)
      parts.push_back("max_split_size_mb:" + std::to_string(large_seg_mb + *rc::gen::inRange<std::uint64_t>(0, 100)));
    switch (*rc::gen::inRange(0, 4)) {
      case 1:
        parts.push_back("roundup_power2_divisions:" + std::to_string(*rc::gen::element(1, 2, 4, 8, 16)));
        break;
      case 2: {
        const auto d = rc::gen::element(0, 1, 2, 4, 8);
        parts.push_back("roundup_power2_divisions:[1:" + std::to_string(*d) + ",2:" + std::to_string(*d) +
                        ",64:" + std::to_string(*d) + ",256:" + std::to_string(*d) + ",>:" + std::to_string(*d) +
                        "]");
        break;
      }
      default: break;
    }
    if (*rc::gen::inRange(0, 2) == 0)
      parts.push_back("garbage_collection_threshold:0." + std::to_string(*rc::gen::inRange(3, 10)));
    const bool expandable = *rc::gen::inRange(0, 3) == 0;
    if (expandable) parts.push_back("expandable_segments:True");
    // Sleep and wake (docs/sleep-wake.md) in 1 of 3 cases (props.h sleep_supported): cachet_sleep
    // maps cudaMalloc segments through the VMM calls. (Expandable segments draw it last, below,
    // so that the draws before keep the cases they made before.)
    if (!expandable && *rc::gen::inRange(0, 3) == 0) parts.push_back("cachet_sleep:True");
    if (*rc::gen::inRange(0, 4) == 0)
      parts.push_back("max_non_split_rounding_mb:" +
                      std::to_string(large_seg_mb + *rc::gen::element<std::uint64_t>(0, 2, 44, 492)));
    // Frees during captures ask record_free_markers (docs/pytorch-allocator.md §14.10.1): a block
    // on two captures' streams fails.
    if (*rc::gen::inRange(0, 4) == 0) parts.push_back("graph_capture_record_stream_reuse:True");
    // Expandable segments sleep by the mapped run (docs/sleep-wake.md section 3).
    if (expandable && *rc::gen::inRange(0, 3) == 0) parts.push_back("cachet_sleep:True");
    std::string text;
    for (const auto& p : parts) text += (text.empty() ? "" : ",") + p;
    try {
      return parse_config(text).config;
    } catch (const std::exception& e) {
      RC_FAIL("generator: invalid config '" + text + "': " + e.what());
    }
  });
}

}  // namespace cachet::props
