// The trace front door on the oracle data: PyTorch's pickle snapshot, the JSON workloads with
// their stats sidecars, and oracle recordings. Expected values were derived independently with
// CPython (json / gzip / pickle with an Unpickler whose find_class raises, no torch), e.g.
//   d = U(io.BytesIO(gzip.open('snapshots/mlp_train.pickle.gz').read())).load()
//   len(d['segments']), sum(len(s['blocks']) for s in d['segments']), len(d['device_traces'][0])
// and the TraceStats figures by a separate Python walk over the same events (live dict of
// addr -> size, pending-free counter, segment set).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstdio>
#include <string>

#include "cachet/io/file.h"
#include "cachet/io/trace_reader.h"
#include "cachet/io/trace_stats.h"

namespace cachet::io {
namespace {

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

TraceEvent ev(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, std::int64_t t) {
  return TraceEvent{a, addr, size, stream, t};
}

std::string setting(const TraceFile& t, std::string_view key) {
  for (const auto& [k, v] : t.settings.fields)
    if (k == key) return v;
  return "<absent>";
}

TEST(TraceReader, MlpTrainPickle) {
  const TraceFile t = read_trace(kData + "snapshots/mlp_train.pickle.gz");
  EXPECT_EQ(t.format, TraceFormat::SnapshotPickle);
  ASSERT_EQ(t.devices.size(), 1u);
  const DeviceTrace& d = t.devices[0];
  EXPECT_EQ(d.device, 0);
  // 15 segments, 52 blocks (39 active_allocated, 13 inactive), 8 large, 453 trace events.
  ASSERT_EQ(d.segments.size(), 15u);
  std::size_t blocks = 0, allocated = 0, large = 0;
  for (const auto& s : d.segments) {
    blocks += s.blocks.size();
    large += s.is_large;
    for (const auto& b : s.blocks) allocated += b.state == BlockState::ActiveAllocated;
  }
  EXPECT_EQ(blocks, 52u);
  EXPECT_EQ(allocated, 39u);
  EXPECT_EQ(large, 8u);
  ASSERT_EQ(d.events.size(), 453u);
  // First segment by address: small, 2 MiB, one inactive block with stale requested 524288.
  const SegmentSnapshot& s0 = d.segments.front();
  EXPECT_EQ(s0.address, 139899393015808u);
  EXPECT_EQ(s0.total_size, 2097152u);
  EXPECT_EQ(s0.stream, 0u);
  EXPECT_FALSE(s0.is_large);
  EXPECT_FALSE(s0.is_expandable);
  ASSERT_EQ(s0.blocks.size(), 1u);
  EXPECT_EQ(s0.blocks[0], (BlockSnapshot{139899393015808u, 2097152, 524288, BlockState::Inactive}));
  // Last segment: 20 MiB large, five 4 MiB allocated blocks.
  const SegmentSnapshot& sl = d.segments.back();
  EXPECT_EQ(sl.address, 139900313665536u);
  EXPECT_EQ(sl.total_size, 20971520u);
  EXPECT_TRUE(sl.is_large);
  ASSERT_EQ(sl.blocks.size(), 5u);
  EXPECT_EQ(sl.blocks[4],
            (BlockSnapshot{139900330442752u, 4194304, 4194304, BlockState::ActiveAllocated}));
  EXPECT_EQ(d.events.front(),
            ev(TraceAction::SegmentAlloc, 139900313665536u, 20971520, 0, 1795268872187564));
  EXPECT_EQ(d.events[1], ev(TraceAction::Alloc, 139900313665536u, 4194304, 0, 1795268872187568));
  EXPECT_EQ(d.events.back(),
            ev(TraceAction::FreeCompleted, 139900238006272u, 4096, 0, 1795268877544192));
  // allocator_settings: 9 fields, empty conf.
  ASSERT_TRUE(t.settings.conf.has_value());
  EXPECT_EQ(*t.settings.conf, "");
  EXPECT_EQ(t.settings.fields.size(), 9u);
  EXPECT_EQ(setting(t, "max_split_size"), "-1");
  EXPECT_EQ(setting(t, "garbage_collection_threshold"), "0.0");
  EXPECT_EQ(setting(t, "expandable_segments"), "False");
  EXPECT_EQ(setting(t, "pinned_num_register_threads"), "1");
  EXPECT_EQ(setting(t, "roundup_power2_divisions").substr(0, 17), "{'1': 0, '2': 0, ");
  EXPECT_FALSE(t.total_memory.has_value());  // no sidecar for the pickle

  const TraceStats st = analyze_trace(d.events);
  EXPECT_EQ(st.events, 453u);
  EXPECT_EQ(st.count(TraceAction::Alloc), 172u);
  EXPECT_EQ(st.count(TraceAction::FreeRequested), 133u);
  EXPECT_EQ(st.count(TraceAction::FreeCompleted), 133u);
  EXPECT_EQ(st.count(TraceAction::SegmentAlloc), 15u);
  EXPECT_EQ(st.allocs_never_freed, 39u);
  EXPECT_EQ(st.bytes_never_freed, 143728640u);
  EXPECT_EQ(st.peak_live_requested, 194109440u);
  EXPECT_FALSE(st.starts_mid_run());
}

struct Workload {
  const char* file;
  std::size_t events;
  TraceEvent first, last;
  const char* conf;
  std::uint64_t alloc, segment_alloc, segment_map;
  Bytes peak_live;
};

class JsonWorkloads : public ::testing::TestWithParam<Workload> {};

TEST_P(JsonWorkloads, ReadsEveryEvent) {
  const Workload& w = GetParam();
  const TraceFile t = read_trace(kData + "workloads/" + w.file);
  EXPECT_EQ(t.format, TraceFormat::SnapshotJson);
  ASSERT_EQ(t.devices.size(), 1u);
  const auto& events = t.devices[0].events;
  ASSERT_EQ(events.size(), w.events);
  EXPECT_EQ(events.front(), w.first);
  EXPECT_EQ(events.back(), w.last);
  EXPECT_TRUE(t.devices[0].segments.empty());
  ASSERT_TRUE(t.settings.conf.has_value());
  EXPECT_EQ(*t.settings.conf, w.conf);
  // From the .stats.json sidecar.
  EXPECT_NE(t.sidecar.find(".stats.json"), std::string::npos);
  EXPECT_EQ(t.total_memory, std::optional<Bytes>(150109880320u));
  EXPECT_EQ(t.device_name, "NVIDIA H200");
  EXPECT_EQ(t.final_stats.size(), 122u);
  const TraceStats st = analyze_trace(events);
  EXPECT_EQ(st.count(TraceAction::Alloc), w.alloc);
  EXPECT_EQ(st.count(TraceAction::SegmentAlloc), w.segment_alloc);
  EXPECT_EQ(st.count(TraceAction::SegmentMap), w.segment_map);
  EXPECT_EQ(st.count(TraceAction::FreeRequested), w.alloc - 3);
  EXPECT_EQ(st.allocs_never_freed, 3u);
  EXPECT_EQ(st.bytes_never_freed, 68157440u);
  if (w.peak_live) {
    EXPECT_EQ(st.peak_live_requested, w.peak_live);
  }
  EXPECT_FALSE(st.starts_mid_run());
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, JsonWorkloads,
    ::testing::Values(
        Workload{"gpt2_train.trace.json.gz", 18685,
                 {TraceAction::SegmentAlloc, 139901982998528u, 155189248, 0, 1795268528747676},
                 {TraceAction::FreeCompleted, 139896511232000u, 4, 0, 1795268531791094}, "",
                 6179, 154, 0, 13594206920u},
        Workload{"gpt2_train_exp.trace.json.gz", 18684,
                 {TraceAction::SegmentMap, 12918456320u, 167772160, 0, 1795268548823894},
                 {TraceAction::FreeCompleted, 181839546368u, 4, 0, 1795268549662497},
                 "expandable_segments:True", 6179, 0, 153, 0},
        Workload{"resnet50_train.trace.json.gz", 9788,
                 {TraceAction::SegmentAlloc, 140073477603328u, 2097152, 0, 1795268562207436},
                 {TraceAction::FreeCompleted, 140073561455104u, 4, 0, 1795268563205060}, "",
                 3228, 110, 0, 5830299792u},
        Workload{"resnet50_train_exp.trace.json.gz", 9795,
                 {TraceAction::SegmentMap, 12918456320u, 2097152, 0, 1795268574068234},
                 {TraceAction::FreeCompleted, 12937659904u, 4, 0, 1795268575011918},
                 "expandable_segments:True", 3228, 0, 117, 0}));

// Trace row counts of all 30 oracle recordings (len(d['trace'])).
TEST(TraceReader, OracleRecordingRowCounts) {
  const std::pair<const char*, std::size_t> kRows[] = {
      {"frag_default", 3690},          {"frag_expandable", 3454},
      {"frag_gc", 3818},               {"frag_msplit128", 3764},
      {"frag_msplit256_r4", 3742},     {"frag_rdivlist", 3690},
      {"mixed_default", 4450},         {"mixed_empty_default", 4493},
      {"mixed_empty_expandable", 4560}, {"mixed_empty_gc", 4816},
      {"mixed_empty_msplit128", 4713}, {"mixed_empty_msplit256_r4", 4600},
      {"mixed_empty_rdivlist", 4484},  {"mixed_expandable", 4461},
      {"mixed_gc", 4788},              {"mixed_msplit128", 4529},
      {"mixed_msplit256_r4", 4479},    {"mixed_rdivlist", 4446},
      {"pressure_default", 2287},      {"pressure_expandable", 2385},
      {"pressure_gc", 2904},           {"pressure_msplit128", 2731},
      {"pressure_msplit256_r4", 2612}, {"pressure_rdivlist", 2266},
      {"small_default", 4422},         {"small_expandable", 4421},
      {"small_gc", 4422},              {"small_msplit128", 4422},
      {"small_msplit256_r4", 4423},    {"small_rdivlist", 4422},
  };
  for (const auto& [label, rows] : kRows) {
    SCOPED_TRACE(label);
    const TraceFile t = read_trace(kData + "results/res_" + label + ".json.gz");
    EXPECT_EQ(t.format, TraceFormat::OracleRecording);
    ASSERT_EQ(t.devices.size(), 1u);
    EXPECT_EQ(t.devices[0].events.size(), rows);
    EXPECT_EQ(t.total_memory, std::optional<Bytes>(150109880320u));
    EXPECT_TRUE(t.settings.conf.has_value());
    EXPECT_EQ(t.final_stats.size(), 122u);
  }
}

TEST(TraceReader, OracleRecordingFields) {
  const TraceFile t = read_trace(kData + "results/res_pressure_default.json.gz");
  EXPECT_EQ(*t.settings.conf, "");
  EXPECT_EQ(t.cap, std::optional<Bytes>(6442450944u));
  const auto& e = t.devices[0].events;
  // trace[1124] = ['oom', None, 678796288, 739570928]; trace[1123] a free_completed.
  EXPECT_EQ(e[1124], ev(TraceAction::Oom, 0, 678796288, 739570928, 0));
  EXPECT_EQ(e[1123], ev(TraceAction::FreeCompleted, 139737968934912u, 30248546, 0, 0));
  EXPECT_EQ(analyze_trace(e).count(TraceAction::Oom), 23u);
  // segments[0]: 1283457024-byte large segment; blocks [size, requested, state] get addresses
  // from the running offset.
  const auto& segs = t.devices[0].segments;
  ASSERT_EQ(segs.size(), 7u);
  std::size_t blocks = 0;
  for (const auto& s : segs) blocks += s.blocks.size();
  EXPECT_EQ(blocks, 38u);
  const auto& s0 = segs.front();
  EXPECT_EQ(s0.address, 139732533116928u);
  EXPECT_EQ(s0.total_size, 1283457024u);
  EXPECT_TRUE(s0.is_large);
  EXPECT_EQ(s0.blocks[0], (BlockSnapshot{139732533116928u, 804948480, 804948249, BlockState::Inactive}));
  EXPECT_EQ(s0.blocks[1], (BlockSnapshot{139732533116928u + 804948480, 244657664, 244657371,
                                         BlockState::ActiveAllocated}));

  const TraceFile g = read_trace(kData + "results/res_frag_gc.json.gz");
  EXPECT_EQ(*g.settings.conf, "garbage_collection_threshold:0.6,max_split_size_mb:64");
  EXPECT_EQ(g.cap, std::optional<Bytes>(17179869184u));
  const TraceStats st = analyze_trace(g.devices[0].events);
  EXPECT_EQ(st.count(TraceAction::SegmentAlloc), 291u);
  EXPECT_EQ(st.count(TraceAction::SegmentFree), 284u);
  EXPECT_EQ(st.segment_frees_without_alloc, 0u);
}

TEST(TraceReader, DetectsFormatByContentNotName) {
  // The gzipped pickle, gunzipped and handed over under a misleading name.
  const std::string pickle = read_file(kData + "snapshots/mlp_train.pickle.gz");
  EXPECT_EQ(parse_trace(pickle, "looks_like.json").format, TraceFormat::SnapshotPickle);
  const std::string json = read_file(kData + "workloads/resnet50_train.trace.json.gz");
  EXPECT_EQ(parse_trace(json, "x.pickle").format, TraceFormat::SnapshotJson);
  EXPECT_EQ(parse_trace("  \n" + json, "x").devices[0].events.size(), 9788u);
  try {
    (void)parse_trace("hello", "notes.txt");
    ADD_FAILURE();
  } catch (const ReadError& e) {
    EXPECT_NE(std::string(e.what()).find("notes.txt: unrecognised format (first byte 0x68 'h'): cachet reads"),
              std::string::npos)
        << e.what();
  }
}

// The segments' pools (segment_pool_id), in the pickle and in a JSON recording, and a gzipped
// stats sidecar. Expected: CPython over the same files (Counter of segment_pool_id; the stats
// file's keys), as at the top.
TEST(TraceReader, SegmentPoolIds) {
  const std::string h100 = std::string(CACHET_TEST_DATA) + "/oracle-h100/";
  const TraceFile t = read_trace(h100 + "snapshots/graphed_mlp.pickle.gz");
  ASSERT_EQ(t.devices.size(), 1u);
  const Snapshot& segs = t.devices[0].segments;
  ASSERT_EQ(segs.size(), 20u);
  std::map<PoolId, int> by_pool;
  for (const auto& s : segs) ++by_pool[s.pool_id];
  EXPECT_EQ(by_pool, (std::map<PoolId, int>{{PoolId{0, 0}, 10}, {PoolId{0, 1}, 8}, {PoolId{0, 2}, 2}}));
  EXPECT_EQ(segs[2].address, 0x7fb1b1e00000u);  // the first (0, 1) segment by address
  EXPECT_EQ(segs[2].pool_id, (PoolId{0, 1}));
  EXPECT_EQ(t.devices[0].events.size(), 602u);
  // graphed_mlp.stats.json.gz beside it: gzipped sidecars are read too.
  EXPECT_NE(t.sidecar.find("graphed_mlp.stats.json.gz"), std::string::npos) << t.sidecar;
  EXPECT_EQ(t.total_memory, std::optional<Bytes>(85017493504u));
  EXPECT_EQ(t.device_name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(t.final_stats.size(), 122u);
  EXPECT_EQ(t.final_stats.at("num_device_alloc"), 27);

  const TraceFile r = read_trace(h100 + "results/res_pools_default.json.gz");
  ASSERT_EQ(r.devices.size(), 1u);
  const Snapshot& rs = r.devices[0].segments;
  ASSERT_EQ(rs.size(), 77u);
  EXPECT_EQ(std::count_if(rs.begin(), rs.end(), [](const SegmentSnapshot& s) { return !s.pool_id.is_default(); }),
            51);
  EXPECT_EQ(rs[0].address, 140109584269312u);
  EXPECT_EQ(rs[0].pool_id, (PoolId{0, 0}));
  EXPECT_EQ(rs[1].pool_id, (PoolId{0, 37}));
}

TEST(TraceReader, SidecarPath) {
  EXPECT_EQ(stats_sidecar_path("w/gpt2_train.trace.json.gz"), "w/gpt2_train.stats.json");
  EXPECT_EQ(stats_sidecar_path("snap.pickle"), "snap.stats.json");
  EXPECT_EQ(stats_sidecar_path("a.json"), "a.stats.json");
}

TEST(TraceReader, MidRunTraceStats) {
  // A trace that starts mid-run: a free of a block never seen allocated, then a completion,
  // a segment_free of an unknown segment, an alloc never freed.
  const std::string json = R"({"device_traces": [[
    {"action": "free_requested", "addr": 4096, "size": 100, "stream": 0, "time_us": 10},
    {"action": "free_completed", "addr": 4096, "size": 100, "stream": 0, "time_us": 11},
    {"action": "free_completed", "addr": 8192, "size": 7, "stream": 0, "time_us": 9},
    {"action": "segment_free", "addr": 0, "size": 2097152, "stream": 0, "time_us": 12},
    {"action": "alloc", "addr": 512, "size": 300, "stream": 5, "time_us": 13},
    {"action": "oom", "device_free": 1024, "size": 4096, "stream": 5, "time_us": 14},
    {"action": "snapshot", "addr": 0, "size": 300, "stream": 0}
  ]], "segments": []})";
  const TraceFile t = parse_trace(json, "mid.json");
  const auto& e = t.devices[0].events;
  ASSERT_EQ(e.size(), 7u);
  EXPECT_EQ(e[5], ev(TraceAction::Oom, 1024, 4096, 5, 14));
  EXPECT_EQ(e[6], ev(TraceAction::Snapshot, 0, 300, 0, 0));
  const TraceStats st = analyze_trace(e);
  EXPECT_EQ(st.frees_without_alloc, 1u);
  EXPECT_EQ(st.completions_without_request, 1u);
  EXPECT_EQ(st.segment_frees_without_alloc, 1u);
  EXPECT_EQ(st.allocs_never_freed, 1u);
  EXPECT_EQ(st.bytes_never_freed, 300u);
  EXPECT_EQ(st.time_reversals, 1u);  // 11 -> 9
  EXPECT_TRUE(st.starts_mid_run());
  EXPECT_EQ(st.one_line(),
            "7 events: alloc 1, free_requested 1, free_completed 2, segment_free 1, snapshot 1, "
            "oom 1; live at end: 1 blocks (300 bytes requested), 0 frees pending; anomalies: 1 frees "
            "without alloc, 1 free_completed without free_requested, 1 segment frees without "
            "segment_alloc, 1 time reversals (trace starts mid-run or its ring buffer dropped "
            "events)");
}

TEST(TraceReader, ClearErrorsForWrongTypesAndMissingKeys) {
  auto error_of = [](const std::string& json) -> std::string {
    try {
      (void)parse_trace(json, "t.json");
    } catch (const ReadError& e) {
      return e.what();
    }
    return "no error";
  };
  auto has = [](const std::string& msg, std::string_view needle) {
    return msg.find(needle) != std::string::npos;
  };
  std::string m = error_of(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": "x", "stream": 0}]]})");
  EXPECT_TRUE(has(m, "t.json: device_traces[0][0].size: wrong JSON type")) << m;
  m = error_of(R"({"device_traces": [[{"action": "alloc", "addr": 1, "stream": 0}]]})");
  EXPECT_TRUE(has(m, "t.json: device_traces[0][0]: missing key 'size'")) << m;
  m = error_of(R"({"device_traces": [[{"action": "malloc", "addr": 1, "size": 2, "stream": 0}]]})");
  EXPECT_TRUE(has(m, "device_traces[0][0].action: unknown trace action 'malloc'")) << m;
  m = error_of(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1152921504606846976, "stream": 0}]]})");
  EXPECT_TRUE(has(m, "device_traces[0][0].size: absurd size 1152921504606846976")) << m;
  m = error_of(R"({"device_traces": [[{"action": "alloc", "addr": -5, "size": 1, "stream": 0}]]})");
  EXPECT_TRUE(has(m, "device_traces[0][0].addr: negative size -5")) << m;
  m = error_of(R"({"segments": [{"address": 0, "total_size": 2, "stream": 0, "segment_type": "huge", "blocks": []}]})");
  EXPECT_TRUE(has(m, "segments[0].segment_type: expected 'small' or 'large', got 'huge'")) << m;
  m = error_of(R"({"segments": [{"device": 5000, "address": 0}]})");
  EXPECT_TRUE(has(m, "segments[0].device: device index 5000 out of range")) << m;
  m = error_of(R"({"trace": [["alloc", 1, 2]], "steps": []})");
  EXPECT_TRUE(has(m, "trace[0]: expected [action, addr, size, stream], got 3 items")) << m;
  m = error_of(R"({"final_stats": {}})");
  EXPECT_TRUE(has(m, "no 'device_traces', 'segments' or 'trace' key")) << m;
  m = error_of(R"({"device_traces": [[]]} xx)");  // simdjson refuses it while indexing
  EXPECT_EQ(m, "t.json: <root>: malformed JSON: text after the end of the top-level value, at byte 24");
  // Hostile nesting: the path keeps its innermost 157 characters.
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"a":)";
  std::string tail = "a";
  for (int i = 0; i < 78; ++i) tail += ".a";
  EXPECT_EQ(error_of(deep), "t.json: ..." + tail +
                                ": truncated JSON: the text ends at byte 500, with 100 objects or arrays left open; the "
                                "file was cut short (an interrupted write or copy?): save or copy it again");
  m = error_of(R"({"device_traces": [[{"action": "alloc", "addr": 1,)");
  EXPECT_EQ(m, "t.json: device_traces[0][0].addr: truncated JSON: the text ends at byte 50, with 4 objects or arrays "
               "left open; the file was cut short (an interrupted write or copy?): save or copy it again");
}

// Throughput of the JSON path on gpt2_train (gunzip excluded and included).
TEST(TraceReader, JsonThroughput) {
  const std::string gz = [] {
    std::FILE* f = std::fopen((kData + "workloads/gpt2_train.trace.json.gz").c_str(), "rb");
    std::string s;
    char buf[65536];
    std::size_t n;
    while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    if (f) std::fclose(f);
    return s;
  }();
  const std::string plain = gunzip(gz, "gpt2");
  using clock = std::chrono::steady_clock;
  const int reps = 20;
  auto t0 = clock::now();
  std::size_t events = 0;
  for (int i = 0; i < reps; ++i) events += parse_trace(plain, "gpt2").event_count();
  auto t1 = clock::now();
  for (int i = 0; i < reps; ++i) events += parse_trace(gz, "gpt2").event_count();
  auto t2 = clock::now();
  const double s_plain = std::chrono::duration<double>(t1 - t0).count();
  const double s_gz = std::chrono::duration<double>(t2 - t1).count();
  EXPECT_EQ(events, 2u * reps * 18685);
  std::printf("gpt2_train JSON: %.2f M events/s parsed (%.0f MB/s), %.2f M events/s with gunzip\n",
              reps * 18685 / s_plain / 1e6, reps * plain.size() / s_plain / 1e6,
              reps * 18685 / s_gz / 1e6);
}

// One large trace, as replay meets it: gpt2_train's events repeated 50 times (934,250 events,
// about 105 MB of JSON), parsed once.
TEST(TraceReader, JsonThroughputLarge) {
  const std::string plain = read_file(kData + "workloads/gpt2_train.trace.json.gz");
  const std::size_t open = plain.find("[[") + 2, close = plain.rfind("]]");
  ASSERT_LT(open, close);
  const std::string_view events(plain.data() + open, close - open);
  std::string big = plain.substr(0, open);
  const int copies = 50;
  big.reserve(plain.size() * copies + 64);
  for (int i = 0; i < copies; ++i) {
    if (i) big += ", ";
    big += events;
  }
  big += plain.substr(close);
  const auto t0 = std::chrono::steady_clock::now();
  const TraceFile t = parse_trace(big, "gpt2x50");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(t.event_count(), 18685u * copies);
  EXPECT_EQ(t.devices[0].events[18685], t.devices[0].events[0]);
  std::printf("gpt2_train x%d JSON (%zu MB): %.2f M events/s parsed (%.0f MB/s)\n", copies,
              big.size() >> 20, t.event_count() / s / 1e6, big.size() / s / 1e6);
}

}  // namespace
}  // namespace cachet::io
