// Lockstep: gpu::CachingAllocator with policy:cachet on the host backend against
// model::CachetPolicy (the rules R1-R9 of gpu/include/cachet/gpu/policy_cachet.h, written
// independently). Both sides get the same operations; after every one they must agree on the
// returned pointer, the OutOfMemory outcome, every flattened stat, the sequence of map/unmap
// calls, the snapshot, and both must pass their own invariants.
//
// The model's SegmentSource (Mirror) hands out the address the gpu side's backend reserved, so
// pointers compare directly, and refuses a mapping exactly when the host backend would (the
// same capacity). On a mismatch the test prints the seed, the op index, the differing items,
// and the op list shrunk to a still-failing one, in the `ops` text format that
// CACHET_LOCKSTEP_OPS=<file> replays (test Lockstep.ReplayFile).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/io/recording.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/stats.h"

namespace cachet::test {
namespace {

// ------------------------------------------------------------------ device call logs

struct Call {
  char kind;  // 'm' map, 'u' unmap
  std::uint64_t addr;
  Bytes size;
  friend bool operator==(const Call&, const Call&) = default;
};

// The gpu side's DeviceMemory: the host backend, with its reservation and map/unmap calls logged.
class Spy final : public gpu::DeviceMemory {
 public:
  Spy(std::unique_ptr<gpu::DeviceMemory> inner, std::vector<Call>* calls, std::uint64_t* base)
      : in_(std::move(inner)), calls_(calls), base_(base) {}
  gpu::BackendCaps caps() const override { return in_->caps(); }
  DeviceIndex device() const override { return in_->device(); }
  gpu::Result<gpu::DevicePtr> malloc(Bytes n) override { return in_->malloc(n); }
  gpu::Status free(gpu::DevicePtr p) override { return in_->free(p); }
  gpu::Result<gpu::MemInfo> mem_get_info() override { return in_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return in_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return in_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override {
    return in_->event_record(e, s);
  }
  gpu::Result<bool> event_query(gpu::EventHandle e) override { return in_->event_query(e); }
  gpu::Status event_synchronize(gpu::EventHandle e) override { return in_->event_synchronize(e); }
  void event_destroy(gpu::EventHandle e) override { in_->event_destroy(e); }
  gpu::Result<gpu::DevicePtr> reserve(Bytes n) override {
    auto r = in_->reserve(n);
    if (r.is_ok()) *base_ = r.value;
    return r;
  }
  gpu::Status unreserve(gpu::DevicePtr p, Bytes n) override { return in_->unreserve(p, n); }
  gpu::Status map(gpu::DevicePtr p, Bytes n) override {
    auto st = in_->map(p, n);
    if (st.is_ok()) calls_->push_back({'m', p, n});
    return st;
  }
  gpu::Status unmap(gpu::DevicePtr p, Bytes n) override {
    calls_->push_back({'u', p, n});
    return in_->unmap(p, n);
  }

 private:
  std::unique_ptr<gpu::DeviceMemory> in_;
  std::vector<Call>* calls_;
  std::uint64_t* base_;
};

// The model side's SegmentSource: the gpu side's reservation address, the host backend's
// capacity rule (a mapping that would pass it fails), and the same call log.
class Mirror final : public model::SegmentSource {
 public:
  Mirror(Bytes capacity, const std::uint64_t* gpu_base)
      : capacity_(capacity), gpu_base_(gpu_base) {}
  std::optional<std::uint64_t> allocate(Bytes) override {
    throw std::logic_error("policy:cachet never cudaMallocs");
  }
  void free(std::uint64_t, Bytes) override {
    throw std::logic_error("policy:cachet never cudaFrees");
  }
  std::uint64_t reserve(Bytes) override { return *gpu_base_ != 0 ? *gpu_base_ : 0x300000000; }
  void release_reservation(std::uint64_t, Bytes) override {}
  bool map(std::uint64_t addr, Bytes size) override {
    if (used_ + size > capacity_) return false;
    used_ += size;
    calls.push_back({'m', addr, size});
    return true;
  }
  void unmap(std::uint64_t addr, Bytes size) override {
    used_ -= size;
    calls.push_back({'u', addr, size});
  }
  Bytes total_memory() const override { return capacity_; }
  Bytes free_memory() const override { return capacity_ - used_; }
  std::optional<Bytes> process_in_use() const override { return used_; }
  std::vector<Call> calls;

 private:
  Bytes capacity_;
  Bytes used_ = 0;
  const std::uint64_t* gpu_base_;
};

// ------------------------------------------------------------------ operations

struct Op {
  char kind;  // a: allocate id size stream; f: free id; r: record_stream id stream;
              // c: complete_events stream; C: complete_all_events; e: empty_cache;
              // F: set_memory_fraction(size / 1e6)
  std::uint64_t id = 0;
  Bytes size = 0;
  StreamId stream = 0;
};

std::string to_text(const Op& o) {
  std::ostringstream s;
  s << o.kind;
  switch (o.kind) {
    case 'a':
      s << ' ' << o.id << ' ' << o.size << ' ' << o.stream;
      break;
    case 'f':
      s << ' ' << o.id;
      break;
    case 'r':
      s << ' ' << o.id << ' ' << o.stream;
      break;
    case 'c':
      s << ' ' << o.stream;
      break;
    case 'F':
      s << ' ' << o.size;
      break;
    default:
      break;
  }
  return s.str();
}

struct Case {
  Bytes capacity = 4 * GiB;        // host backend capacity = total memory
  std::optional<double> fraction;  // set_memory_fraction before the first op
  std::vector<Op> ops;
};

std::string to_text(const Case& c) {
  std::ostringstream s;
  s << "capacity " << c.capacity << "\n";
  if (c.fraction) s << "fraction " << std::setprecision(17) << *c.fraction << "\n";
  for (const Op& o : c.ops) s << to_text(o) << "\n";
  return s.str();
}

Case parse_case(std::istream& in) {
  Case c;
  std::string word;
  while (in >> word) {
    if (word == "capacity")
      in >> c.capacity;
    else if (word == "fraction") {
      double f;
      in >> f;
      c.fraction = f;
    } else {
      Op o{word[0]};
      switch (o.kind) {
        case 'a':
          in >> o.id >> o.size >> o.stream;
          break;
        case 'f':
          in >> o.id;
          break;
        case 'r':
          in >> o.id >> o.stream;
          break;
        case 'c':
          in >> o.stream;
          break;
        case 'F':
          in >> o.size;
          break;
        default:
          break;
      }
      c.ops.push_back(o);
    }
  }
  return c;
}

// ------------------------------------------------------------------ the lockstep runner

std::string diff_stats(const DeviceStats& g, const DeviceStats& m) {
  std::string out;
  auto gf = flatten(g), mf = flatten(m);
  for (std::size_t i = 0; i < gf.size() && i < mf.size(); ++i)
    if (gf[i] != mf[i])
      out += "  stat " + gf[i].first + ": gpu " + std::to_string(gf[i].second) + ", model " +
             std::to_string(mf[i].second) + "\n";
  return out;
}

// Snapshots compared on what the rules decide: runs of mapped pages and their blocks (requested
// sizes of free blocks are stale and not compared).
std::string diff_snapshots(const Snapshot& g, const Snapshot& m, std::uint64_t base) {
  auto text = [base](const Snapshot& s) {
    std::ostringstream o;
    for (const auto& seg : s) {
      o << "[seg +" << seg.address - base << " " << seg.total_size << ":";
      for (const auto& b : seg.blocks)
        o << " +" << b.address - base << "/" << b.size << "/" << to_string(b.state) << "/"
          << (b.state == BlockState::Inactive ? 0 : b.requested_size);
      o << "]";
    }
    return o.str();
  };
  const std::string a = text(g), b = text(m);
  return a == b ? "" : "  snapshot:\n    gpu   " + a + "\n    model " + b + "\n";
}

std::string calls_text(const std::vector<Call>& v, std::size_t from, std::uint64_t base) {
  std::ostringstream o;
  for (std::size_t i = from; i < v.size(); ++i)
    o << " " << v[i].kind << "(+" << v[i].addr - base << "," << v[i].size << ")";
  return o.str();
}

struct Failure {
  std::size_t op = 0;
  std::string what;
};

// What a run exercised (the model's final counters, summed over cases).
struct Coverage {
  std::int64_t allocs = 0, ooms = 0, retries = 0, maps = 0, unmaps = 0, syncs = 0;
};

struct Options {
  Coverage* coverage = nullptr;
  std::size_t snapshot_every = 1;  // compare snapshots after every n-th op (and after the last)
};

std::optional<Failure> run_case(const Case& c, const Options& opt) {
  std::vector<Call> gpu_calls;
  std::uint64_t gpu_base = 0;
  std::shared_ptr<gpu::HostSim> sim;
  gpu::HostOptions ho;
  ho.capacity = c.capacity;
  Config config;
  config.policy = Policy::Cachet;
  CachingAllocator g(std::make_unique<Spy>(gpu::make_host_memory(ho, &sim), &gpu_calls, &gpu_base),
                     config);
  Mirror mirror(c.capacity, &gpu_base);
  model::CachetPolicy m(config, mirror, 0);
  if (c.fraction) {
    g.set_memory_fraction(*c.fraction);
    m.set_memory_fraction(*c.fraction);
  }
  std::map<std::uint64_t, std::uint64_t> live;  // id -> pointer (the same on both sides)
  std::size_t calls_before = 0;
  for (std::size_t i = 0; i < c.ops.size(); ++i) {
    const Op& o = c.ops[i];
    std::string bad;
    switch (o.kind) {
      case 'a': {
        std::optional<std::uint64_t> gp, mp;
        std::string gerr, merr;
        try {
          gp = reinterpret_cast<std::uintptr_t>(g.allocate(o.size, o.stream));
        } catch (const OutOfMemory&) {
          gerr = "OutOfMemory";
        }
        try {
          mp = m.malloc(o.size, o.stream);
        } catch (const OutOfMemory&) {
          merr = "OutOfMemory";
        }
        auto show = [&](const std::optional<std::uint64_t>& p, const std::string& err) {
          return p ? "+" + std::to_string(*p - gpu_base) : err;
        };
        if (gp != mp || gerr != merr)
          bad += "  allocate: gpu " + show(gp, gerr) + ", model " + show(mp, merr) + "\n";
        if (gp && mp && *gp == *mp && *gp != 0) live[o.id] = *gp;
        break;
      }
      case 'f': {
        auto it = live.find(o.id);
        if (it == live.end()) break;
        g.free(reinterpret_cast<void*>(it->second));
        m.free(it->second);
        live.erase(it);
        break;
      }
      case 'r': {
        auto it = live.find(o.id);
        if (it == live.end()) break;
        g.record_stream(reinterpret_cast<void*>(it->second), o.stream);
        m.record_stream(it->second, o.stream);
        break;
      }
      case 'c':
        sim->complete_events(o.stream);
        m.complete_events(o.stream);
        break;
      case 'C':
        sim->complete_all_events();
        m.complete_all_events();
        break;
      case 'e':
        g.empty_cache();
        m.empty_cache();
        break;
      case 'F':
        g.set_memory_fraction(static_cast<double>(o.size) / 1e6);
        m.set_memory_fraction(static_cast<double>(o.size) / 1e6);
        break;
      default:
        break;
    }
    bad += diff_stats(g.stats(), m.stats());
    if (gpu_calls != mirror.calls)
      bad += "  device calls since the previous op:\n    gpu  " +
             calls_text(gpu_calls, calls_before, gpu_base) + "\n    model" +
             calls_text(mirror.calls, calls_before, gpu_base) + "\n";
    calls_before = std::min(gpu_calls.size(), mirror.calls.size());
    for (const std::string& v : g.invariants()) bad += "  gpu invariant: " + v + "\n";
    try {
      m.check_invariants();
    } catch (const std::logic_error& e) {
      bad += std::string("  model invariant: ") + e.what() + "\n";
    }
    if (bad.empty() && ((i + 1) % opt.snapshot_every == 0 || i + 1 == c.ops.size()))
      bad += diff_snapshots(g.snapshot(), m.snapshot(), gpu_base);
    if (!bad.empty()) return Failure{i, bad};
  }
  if (Coverage* cov = opt.coverage) {
    const DeviceStats& s = m.stats();
    cov->allocs += s.allocation[0].allocated;
    cov->ooms += s.num_ooms;
    cov->retries += s.num_alloc_retries;
    cov->maps += s.num_device_alloc;
    cov->unmaps += s.num_device_free;
    cov->syncs += s.num_sync_all_streams;
  }
  return std::nullopt;
}

// Greedy shrink: drop ops one at a time while the case still fails.
Case shrink(Case c, const Options& opt) {
  for (std::size_t i = c.ops.size(); i-- > 0;) {
    Case t = c;
    t.ops.erase(t.ops.begin() + static_cast<std::ptrdiff_t>(i));
    if (auto f = run_case(t, opt)) {
      t.ops.resize(f->op + 1);
      c = std::move(t);
      if (i > c.ops.size()) i = c.ops.size();
    }
  }
  return c;
}

std::string report(const std::string& origin, const Case& c, const Failure& f, const Options& opt) {
  Case cut = c;
  cut.ops.resize(f.op + 1);
  const Case small = shrink(cut, opt);
  const auto sf = run_case(small, opt);
  return origin + ", op " + std::to_string(f.op) + " (" + to_text(c.ops[f.op]) + "):\n" + f.what +
         "shrunk to " + std::to_string(small.ops.size()) +
         " ops (save as a file, run with CACHET_LOCKSTEP_OPS=file):\n" + to_text(small) +
         (sf ? "which fails with:\n" + sf->what : "");
}

// ------------------------------------------------------------------ random cases

Bytes random_size(std::mt19937_64& rng) {
  static const Bytes kEdges[] = {512, 1 * MiB, 2 * MiB, 4 * MiB, 10 * MiB, 20 * MiB};
  std::uniform_int_distribution<int> pick(0, 9);
  switch (pick(rng)) {
    case 0:
    case 1:
    case 2: {  // within 1 KiB of a boundary (512 B, 1 MiB, 2 MiB, ...)
      const Bytes e = kEdges[std::uniform_int_distribution<int>(0, 5)(rng)];
      const auto d = std::uniform_int_distribution<std::int64_t>(-1024, 1024)(rng);
      const auto v = static_cast<std::int64_t>(e) + d;
      return v < 1 ? 1 : static_cast<Bytes>(v);
    }
    case 3:  // an exact multiple of 512 B up to 4 MiB
      return std::uniform_int_distribution<Bytes>(1, 8192)(rng) * 512;
    case 4:  // large: 2 .. 64 MiB
      return std::uniform_int_distribution<Bytes>(2 * MiB, 64 * MiB)(rng);
    default: {  // log-uniform 1 B .. 64 MiB
      const double x = std::uniform_real_distribution<double>(0.0, 26.0)(rng);
      return std::max<Bytes>(1, static_cast<Bytes>(std::exp2(x)));
    }
  }
}

Case random_case(std::uint64_t seed, int n_ops) {
  std::mt19937_64 rng(seed);
  Case c;
  const int streams = std::uniform_int_distribution<int>(1, 3)(rng);
  const int shape = std::uniform_int_distribution<int>(0, 9)(rng);
  if (shape <= 1)
    c.capacity =
        256 * MiB + std::uniform_int_distribution<Bytes>(0, 64)(rng) * 2 * MiB;  // device refuses
  if (shape >= 7) c.fraction = std::uniform_real_distribution<double>(0.02, 0.3)(rng);  // a cap
  std::vector<std::uint64_t> ids;  // allocated and not freed (on the generator's side)
  std::uint64_t next_id = 0;
  auto stream = [&] {
    return static_cast<StreamId>(std::uniform_int_distribution<int>(0, streams - 1)(rng));
  };
  for (int i = 0; i < n_ops; ++i) {
    const int r = std::uniform_int_distribution<int>(0, 99)(rng);
    // Keep the live set moderate: free more when many blocks are live.
    const int alloc_share = ids.size() > 60 ? 30 : 55;
    if (r < alloc_share || ids.empty()) {
      c.ops.push_back({'a', next_id, random_size(rng), stream()});
      ids.push_back(next_id++);
    } else if (r < 85) {
      const auto k = std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng);
      c.ops.push_back({'f', ids[k]});
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (r < 93) {
      const auto k = std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng);
      c.ops.push_back({'r', ids[k], 0, stream()});
    } else if (r < 97) {
      c.ops.push_back({'c', 0, 0, stream()});
    } else if (r < 98) {
      c.ops.push_back({'C'});
    } else if (r < 99 || !c.fraction) {
      c.ops.push_back({'e'});
    } else {  // a new cap, often below the mapped bytes (R7's trim)
      c.ops.push_back({'F', 0, std::uniform_int_distribution<Bytes>(10'000, 300'000)(rng)});
    }
  }
  return c;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 0) : fallback;
}

// The options the lockstep runs with.
Options lockstep_options() {
  return Options{};
}

TEST(Lockstep, RandomSequences) {
  const std::uint64_t first = env_u64("CACHET_LOCKSTEP_SEED", 1);
  const std::uint64_t cases = env_u64("CACHET_LOCKSTEP_CASES", 300);
  const int n_ops = static_cast<int>(env_u64("CACHET_LOCKSTEP_OPS_PER_CASE", 400));
  Coverage cov;
  Options opt = lockstep_options();
  opt.coverage = &cov;
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t ops = 0, failures = 0, ran = 0;
  for (std::uint64_t seed = first; seed < first + cases; ++seed, ++ran) {
    const Case c = random_case(seed, n_ops);
    ops += c.ops.size();
    if (auto f = run_case(c, opt)) {
      ADD_FAILURE() << report("seed " + std::to_string(seed) + " (CACHET_LOCKSTEP_SEED=" +
                                  std::to_string(seed) + " CACHET_LOCKSTEP_CASES=1)",
                              c, *f, opt);
      if (++failures == 3) break;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "lockstep: %llu sequences, %llu ops, %.2f s; model totals: %lld allocations, %lld OOMs, %lld "
      "retries, "
      "%lld maps, %lld unmaps, %lld event syncs\n",
      static_cast<unsigned long long>(ran), static_cast<unsigned long long>(ops), s,
      static_cast<long long>(cov.allocs), static_cast<long long>(cov.ooms),
      static_cast<long long>(cov.retries), static_cast<long long>(cov.maps),
      static_cast<long long>(cov.unmaps), static_cast<long long>(cov.syncs));
  if (failures == 0 && cases >= 100) {  // the generator still reaches every rule
    EXPECT_GT(cov.ooms, 0);
    EXPECT_GT(cov.retries, cov.ooms);
    EXPECT_GT(cov.unmaps, 0);
    EXPECT_GT(cov.syncs, 0);
  }
}

// The oracle op lists (tests/data/oracle/ops), on a roomy device and on a tight one (OOMs and
// device refusals), with and without a cap.
TEST(Lockstep, OracleOpLists) {
  const std::string dir = std::string(CACHET_TEST_DATA) + "/oracle/ops";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().string().ends_with(".json.gz")) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  Options opt = lockstep_options();
  opt.snapshot_every =
      64;  // every op's pointer, stats, calls and invariants; snapshots every 64 ops
  for (const std::string& path : files) {
    Case base;
    for (const io::Op& o : io::read_ops(path)) {
      if (o.kind == io::Op::Kind::Alloc)
        base.ops.push_back({'a', o.id, o.size, o.stream});
      else if (o.kind == io::Op::Kind::Free)
        base.ops.push_back({'f', o.id});
      else
        base.ops.push_back({'e'});
    }
    struct Variant {
      const char* name;
      Bytes capacity;
      std::optional<double> fraction;
    };
    for (const Variant& v :
         {Variant{"80 GiB", 80 * GiB, std::nullopt}, Variant{"1 GiB", 1 * GiB, std::nullopt},
          Variant{"8 GiB, fraction 0.05", 8 * GiB, 0.05}}) {
      Case c = base;
      c.capacity = v.capacity;
      c.fraction = v.fraction;
      if (auto f = run_case(c, opt))
        ADD_FAILURE() << report(std::filesystem::path(path).filename().string() + " on " + v.name,
                                c, *f, opt);
    }
  }
}

// CACHET_LOCKSTEP_OPS=<file>: replay one case printed by a failure above.
TEST(Lockstep, ReplayFile) {
  const char* path = std::getenv("CACHET_LOCKSTEP_OPS");
  if (path == nullptr) GTEST_SKIP() << "set CACHET_LOCKSTEP_OPS=<file> to replay a printed case";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const Case c = parse_case(in);
  const Options opt = lockstep_options();
  if (auto f = run_case(c, opt)) ADD_FAILURE() << report(path, c, *f, opt);
}

// A few hand-written cases through the runner (they print nothing when both sides agree).
TEST(Lockstep, HandWritten) {
  const Options opt = lockstep_options();
  // Pending blocks, a second stream, then empty_cache.
  Case c;
  c.ops = {{'a', 0, 1 * MiB, 0},
           {'a', 1, 1 * MiB, 0},
           {'r', 1, 0, 1},
           {'f', 1},
           {'a', 2, 3 * MiB, 1},
           {'c', 0, 0, 1},
           {'a', 3, 512, 0},
           {'f', 0},
           {'a', 4, 5 * MiB, 0},
           {'e'},
           {'f', 2},
           {'f', 3},
           {'f', 4},
           {'e'}};
  if (auto f = run_case(c, opt)) ADD_FAILURE() << report("hand-written", c, *f, opt);
}

// The model alone on a 1 GiB synthetic device, for hand-computed expectations.
struct ModelOn1GiB {
  model::SyntheticSegmentSource src{1 * GiB};
  Config config = [] {
    Config c;
    c.policy = Policy::Cachet;
    return c;
  }();
  model::CachetPolicy m{config, src};
};

// R7's retry runs R2 again after the event wait. Cap one page: a = [0, 1 MiB) and b =
// [1 MiB, 2 MiB) fill it; b is freed with a use on stream 1 (pending). The next 1 MiB request
// finds no free block (R2) and no window under the cap (R3 needs page 1), so it retries: the wait
// frees b, and R2 hands b's bytes back with no device call.
TEST(Lockstep, RetryRunsBestFitAfterTheWait) {
  Case c;
  c.capacity = 1 * GiB;
  c.fraction = 2.0 / 1024.0;  // cap: one page
  c.ops = {
      {'a', 0, 1 * MiB, 0}, {'a', 1, 1 * MiB, 0}, {'r', 1, 0, 1}, {'f', 1}, {'a', 2, 1 * MiB, 0}};
  if (auto f = run_case(c, lockstep_options()))
    ADD_FAILURE() << report("hand-written", c, *f, lockstep_options());
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  m.set_memory_fraction(2.0 / 1024.0);
  const auto a = m.malloc(1 * MiB, 0);
  const auto b = m.malloc(1 * MiB, 0);
  EXPECT_EQ(b, a + 1 * MiB);  // small: the high end of the page's free rest
  m.record_stream(b, 1);
  m.free(b);
  EXPECT_EQ(m.malloc(1 * MiB, 0), b);
  EXPECT_EQ(m.stats().num_ooms, 0);
  EXPECT_EQ(m.stats().num_alloc_retries, 1);
  EXPECT_EQ(m.stats().num_sync_all_streams, 1);
  EXPECT_EQ(m.stats().num_device_alloc, 1);
  EXPECT_EQ(m.stats().num_device_free, 0);
  m.check_invariants();
}

// The same with the freed block away from any unmapped block: cap two pages, four 1 MiB blocks
// fill pages 0 and 1, the second is freed with a use on stream 1. The retry's R2 returns it.
TEST(Lockstep, RetryRunsBestFitInsideMappedPages) {
  Case c;
  c.capacity = 1 * GiB;
  c.fraction = 4.0 / 1024.0;  // cap: two pages
  c.ops = {{'a', 0, 1 * MiB, 0}, {'a', 1, 1 * MiB, 0}, {'a', 2, 1 * MiB, 0},
           {'a', 3, 1 * MiB, 0}, {'r', 1, 0, 1},       {'f', 1},
           {'a', 4, 1 * MiB, 0}};
  if (auto f = run_case(c, lockstep_options()))
    ADD_FAILURE() << report("hand-written", c, *f, lockstep_options());
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  m.set_memory_fraction(4.0 / 1024.0);
  std::vector<std::uint64_t> p;
  for (int i = 0; i < 4; ++i) p.push_back(m.malloc(1 * MiB, 0));
  EXPECT_EQ(p[3], p[0] + 3 * MiB);
  m.record_stream(p[1], 1);
  m.free(p[1]);
  EXPECT_EQ(m.malloc(1 * MiB, 0), p[1]);
  EXPECT_EQ(m.stats().num_ooms, 0);
  EXPECT_EQ(m.stats().num_alloc_retries, 1);
  EXPECT_EQ(m.stats().num_sync_all_streams, 1);
  EXPECT_EQ(m.stats().num_device_alloc, 2);
  m.check_invariants();
}

// A cap lowered below the mapped bytes unmaps whole free pages down to it (R7), at once when
// there are free pages, else at the free() that makes them. Two 10 MiB blocks map pages 0-9.
TEST(Lockstep, LoweredCapTrimsToTheCap) {
  Case c;
  c.capacity = 1 * GiB;
  // Fraction 0.0085 of 1 GiB: cap 9,126,805 B, 4 whole pages.
  c.ops = {{'a', 0, 10 * MiB, 0}, {'a', 1, 10 * MiB, 0}, {'F', 0, 8500, 0}, {'f', 0}, {'f', 1},
           {'a', 2, 6 * MiB, 0}};
  if (auto f = run_case(c, lockstep_options()))
    ADD_FAILURE() << report("hand-written", c, *f, lockstep_options());
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  const auto a = m.malloc(10 * MiB, 0);
  const auto b = m.malloc(10 * MiB, 0);
  EXPECT_EQ(m.mapped_bytes(), 20 * MiB);
  m.set_memory_fraction(0.0085);  // below the live blocks' 10 pages: nothing to unmap yet
  EXPECT_EQ(m.mapped_bytes(), 20 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 0);
  m.check_invariants();  // [INV-CAP-1] allows it: no whole free page is mapped
  m.free(a);             // pages 0-4 whole free, 6 over the cap: all 5 unmapped, in one call
  EXPECT_EQ(m.mapped_bytes(), 10 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 1);
  m.check_invariants();  // still above the cap, with no whole free page
  m.free(b);             // pages 5-9 whole free, 1 over the cap: the highest one (page 9) unmapped
  EXPECT_EQ(m.mapped_bytes(), 8 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 2);
  EXPECT_EQ(m.stats().reserved_bytes[0].current, static_cast<std::int64_t>(8 * MiB));
  m.check_invariants();
  EXPECT_EQ(m.malloc(6 * MiB, 0), b);  // R2: the mapped free block [b, b + 8 MiB) holds it
  EXPECT_EQ(m.stats().num_ooms, 0);
}

}  // namespace
}  // namespace cachet::test
