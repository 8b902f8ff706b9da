// The inputs of the behaviour dump: every oracle recording under both policies, and seeded
// random op sequences under both policies and four configurations.
#include <algorithm>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/io/recording.h"
#include "cachet/trace.h"
#include "dump.h"

namespace cachet::behaviour {
namespace {

constexpr std::uint64_t kSeeds = 20;         // seeds 1..kSeeds
constexpr std::size_t kRandomOps = 500;      // ops per random sequence
constexpr Bytes kRandomCapacity = 8 * GiB;   // the HostSim of random sequences
constexpr StreamId kOtherDeviceStream = 99;  // belongs to device 1: allocate/record on it is a usage error

struct RandomConfig {
  const char* name;
  const char* conf;
  double initial_fraction;  // 1 = none
};
constexpr RandomConfig kRandomConfigs[] = {
    {"default", "", 1.0},
    {"expandable", "expandable_segments:True", 1.0},
    {"msplit128", "max_split_size_mb:128", 1.0},
    {"gc_cap", "garbage_collection_threshold:0.6", 0.5},  // the threshold acts only under a cap
};

std::string with_policy(const std::string& policy, const std::string& conf) {
  if (policy == "pytorch") return conf;
  return "policy:" + policy + (conf.empty() ? "" : "," + conf);
}

// tests/data/<dir>/results/*.json[.gz], sorted by name.
std::vector<std::filesystem::path> recordings(const std::string& data_dir) {
  std::vector<std::filesystem::path> out;
  for (const char* dir : {"oracle", "oracle-h100"}) {
    const auto results = std::filesystem::path(data_dir) / dir / "results";
    std::vector<std::filesystem::path> here;
    for (const auto& e : std::filesystem::directory_iterator(results))
      if (e.path().filename().string().starts_with("res_")) here.push_back(e.path());
    std::sort(here.begin(), here.end());
    out.insert(out.end(), here.begin(), here.end());
  }
  return out;
}

std::vector<Input> recording_inputs(const std::string& policy, const std::string& data_dir) {
  std::vector<Input> out;
  for (const auto& path : recordings(data_dir)) {
    const io::Recording rec = io::read_recording(path.string());
    Input in;
    std::string stem = path.filename().string();
    stem = stem.substr(0, stem.find('.'));
    in.name = path.parent_path().parent_path().filename().string() + "/" + stem + "/" + policy;
    in.conf = with_policy(policy, rec.conf);
    in.host.capacity = rec.total_memory;
    in.host.total_memory = rec.total_memory;
    if (policy == "pytorch") {
      // Recorded-address mode: the driver addresses PyTorch got, in order (as tests/gpu's replays).
      std::vector<gpu::DevicePtr> addrs;
      for (const auto& e : rec.trace)
        if (e.action == TraceAction::SegmentAlloc || e.action == TraceAction::SegmentMap) addrs.push_back(e.addr);
      in.host.recorded = std::move(addrs);
    }
    if (rec.cap > 0) in.initial_fraction = static_cast<double>(rec.cap) / static_cast<double>(rec.total_memory);
    const std::vector<ops::Op> list = io::read_ops(io::ops_path_for(rec.path));
    // The private-pool and capture recordings (docs/pytorch-allocator.md §14) under policy:pytorch
    // only (policy:cachet's run of them is checked by the ctests conform_h100_*_cachet).
    if (policy != "pytorch" &&
        std::any_of(list.begin(), list.end(), [](const ops::Op& op) { return ops::is_pool_op(op); }))
      continue;
    in.streams = rec.streams;
    for (ops::Op op : list) {
      if (auto* a = std::get_if<ops::Allocate>(&op)) a->stream = rec.streams.at(a->stream);  // index -> stream
      in.ops.push_back(op);
    }
    out.push_back(std::move(in));
  }
  return out;
}

std::vector<Input> random_inputs(const std::string& policy) {
  std::vector<Input> out;
  for (const RandomConfig& rc : kRandomConfigs)
    for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
      Input in;
      in.name = std::string("random/") + rc.name + "/seed" + std::to_string(seed) + "/" + policy;
      in.conf = with_policy(policy, rc.conf);
      in.host.capacity = kRandomCapacity;
      if (rc.initial_fraction < 1.0) in.initial_fraction = rc.initial_fraction;
      in.other_device_streams = {kOtherDeviceStream};
      in.ops = random_ops(seed, kRandomOps);
      out.push_back(std::move(in));
    }
  return out;
}

}  // namespace

std::vector<Op> random_ops(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 rng(seed);
  const auto r = [&](std::uint64_t k) { return rng() % k; };  // only the engine's bits: portable
  const std::uint64_t target_live = 8 + r(56);
  const Bytes boundaries[] = {0,           1,           511,         512,          513,
                              MiB - 512,   MiB - 1,     MiB,         MiB + 1,      2 * MiB - 1,
                              2 * MiB,     2 * MiB + 1, 10 * MiB - 1, 10 * MiB,    10 * MiB + 1,
                              20 * MiB,    20 * MiB + 1, 128 * MiB - 1, 128 * MiB, 128 * MiB + 1};
  const double fractions[] = {0.02, 0.1, 0.25, 0.5, 0.75, 1.0};
  std::vector<std::uint64_t> live, freed;
  std::uint64_t next_handle = 0;
  std::vector<Op> ops;
  const auto stream = [&] { return r(100) < 55 ? StreamId{0} : StreamId{1 + r(3)}; };
  const auto size = [&]() -> Bytes {
    const auto u = r(1000);
    if (u < 200) return 1 + r(4096);
    if (u < 400) return 1 + r(MiB);
    if (u < 550) return boundaries[r(std::size(boundaries))];
    if (u < 750) return MiB + 1 + r(9 * MiB);
    if (u < 900) return 10 * MiB + r(90 * MiB);
    if (u < 975) return 100 * MiB + r(924 * MiB);  // oversize under max_split_size_mb:128
    if (u < 995) return GiB + r(5 * GiB);           // OOM, release and retry territory
    return (Bytes{1} << 60) + r(1000);              // >= 1 EiB: PyTorch's "more than 1EB"
  };
  // A handle to free or record: a live one, now and then one already freed (a stale pointer).
  const auto pick = [&](bool remove) -> std::uint64_t {
    if (!freed.empty() && r(100) == 0) return freed[r(freed.size())];
    const std::size_t i = r(live.size());
    const std::uint64_t h = live[i];
    if (remove) {
      live[i] = live.back();
      live.pop_back();
      freed.push_back(h);
    }
    return h;
  };
  while (ops.size() < n) {
    const bool under = live.size() < target_live;
    const std::uint64_t w[] = {under ? 500u : 250u, live.empty() ? 0u : (under ? 300u : 550u),
                               live.empty() ? 0u : 60u, 70, 15, 15};
    std::uint64_t u = r(w[0] + w[1] + w[2] + w[3] + w[4] + w[5]);
    int kind = 0;
    while (u >= w[kind]) u -= w[kind++];
    Op op;
    switch (kind) {
      case 0: {
        const Bytes sz = size();
        const StreamId s = r(100) == 0 ? kOtherDeviceStream : stream();
        op = ops::Allocate{sz, s, next_handle};
        live.push_back(next_handle++);
        break;
      }
      case 1: op = ops::Free{pick(true)}; break;
      case 2: {
        const std::uint64_t h = pick(false);
        op = ops::RecordStream{h, r(50) == 0 ? kOtherDeviceStream : StreamId{r(4)}};
        break;
      }
      case 3: op = ops::CompleteEvents{r(4)}; break;
      case 4: op = ops::EmptyCache{}; break;
      default: op = ops::SetMemoryFraction{r(100) == 0 ? 1.5 : fractions[r(std::size(fractions))]}; break;  // 1.5: a usage error
    }
    ops.push_back(op);
  }
  return ops;
}

std::vector<std::string> group_names() {
  return {"recordings_pytorch", "recordings_cachet", "random_pytorch", "random_cachet"};
}

std::vector<Input> group_inputs(const std::string& group, const std::string& data_dir) {
  if (group == "recordings_pytorch") return recording_inputs("pytorch", data_dir);
  if (group == "recordings_cachet") return recording_inputs("cachet", data_dir);
  if (group == "random_pytorch") return random_inputs("pytorch");
  if (group == "random_cachet") return random_inputs("cachet");
  throw std::invalid_argument("unknown group " + group);
}

}  // namespace cachet::behaviour
