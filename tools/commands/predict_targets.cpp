// tools/predict_targets.cpp: the GPU table of `cachet predict` (predict_targets.h).
#include "predict_targets.h"

#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

namespace cachet::cli {
namespace {
constexpr const char* kMeasured = "measured: cudaMemGetInfo on this project's H200 (2026-12-01)";
constexpr const char* kReported =
    "PyTorch's out-of-memory text for this card as users report it (\"... GiB total capacity\", rounded to "
    "0.01 GiB)";
constexpr std::uint64_t gib(double g) { return static_cast<std::uint64_t>(g * 1073741824.0); }

std::string squash(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c)) && c != '-' && c != '_')
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

const std::vector<GpuTarget>& gpu_targets() {
  static const std::vector<GpuTarget> t = {
      {"NVIDIA H200", {"H200", "H200 141GB", "H200 SXM"}, 150109880320ULL, 90, 132, 232448, 62914560, kMeasured, 0x2335},
      {"NVIDIA H100 80GB HBM3", {"H100", "H100 80GB", "H100 SXM"}, 85017362432ULL, 90, 132, 232448, 52428800,
       "the issue's figure: an H100 80GB reports 79.18 GiB", 0x2330},
      {"NVIDIA H100 PCIe", {"H100 PCIe"}, 85017362432ULL, 90, 114, 232448, 52428800,
       "as the H100 80GB (79.18 GiB)", 0x2331},
      {"NVIDIA A100-SXM4-80GB", {"A100 80GB", "A100-80GB", "A100 80G"}, gib(79.15), 80, 108, 166912, 41943040, kReported, 0x20B2},
      {"NVIDIA A100-SXM4-40GB", {"A100", "A100 40GB", "A100-40GB", "A100 40G"}, gib(39.39), 80, 108, 166912, 41943040,
       kReported, 0x20B0},
      {"NVIDIA L4", {"L4"}, gib(22.03), 89, 58, 101376, 50331648, kReported, 0x27B8},
      {"NVIDIA L40S", {"L40S"}, gib(44.53), 89, 142, 101376, 100663296, kReported, 0x26B9},
      {"NVIDIA GeForce RTX 4090", {"RTX 4090", "4090"}, gib(23.64), 89, 128, 101376, 75497472, kReported, 0x2684},
      {"NVIDIA GeForce RTX 3090", {"RTX 3090", "3090"}, gib(23.69), 86, 82, 101376, 6291456, kReported, 0x2204},
      {"Tesla T4", {"T4"}, gib(14.75), 75, 40, 65536, 4194304, kReported, 0x1EB8},
      {"NVIDIA B200", {"B200"}, gib(178.35), 100, 148, 232448, 132120576, kReported, 0x2901},
      {"NVIDIA GeForce RTX 5090", {"RTX 5090", "5090"}, gib(31.36), 120, 170, 101376, 100663296, kReported, 0x2B85},
  };
  return t;
}

std::optional<GpuTarget> find_gpu(std::string_view text) {
  const std::string want = squash(text);
  for (const GpuTarget& g : gpu_targets()) {
    if (squash(g.name) == want) return g;
    for (const std::string& s : g.spellings)
      if (squash(s) == want) return g;
  }
  return std::nullopt;
}

std::optional<int> parse_arch(std::string_view text) {
  std::string s = squash(text);
  if (s.rfind("sm", 0) == 0) s = s.substr(2);
  if (s.size() == 3 && s[1] == '.') s = {s[0], s[2]};
  if (s.size() < 2 || s.size() > 3) return std::nullopt;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  const int v = std::atoi(s.c_str());
  for (int known : {70, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121})
    if (v == known) return v;
  return std::nullopt;
}

GpuTarget custom_target(std::uint64_t device_memory, int arch) {
  for (const GpuTarget& g : gpu_targets()) {
    if (g.arch != arch) continue;
    GpuTarget t = g;
    t.name = fmt::format("GPU sm_{} ({} bytes)", arch, device_memory);
    t.spellings.clear();
    t.total_memory = device_memory;
    t.source = fmt::format("--device-memory; SM count, shared memory, L2 and PCI ID as the {}", g.name);
    return t;
  }
  GpuTarget t{fmt::format("GPU sm_{} ({} bytes)", arch, device_memory), {}, device_memory, arch, 80,
              arch >= 80 ? 166912 : 65536, 41943040, "--device-memory; SM count 80, generic shared memory and L2"};
  return t;
}

std::string gpu_list_text() {
  std::string out;
  for (const GpuTarget& g : gpu_targets()) {
    out += fmt::format("  {:<26} sm_{:<4} {:>7.2f} GiB  --gpu", g.name, g.arch,
                       static_cast<double>(g.total_memory) / 1073741824.0);
    for (std::size_t i = 0; i < g.spellings.size(); ++i) out += (i ? ", '" : " '") + g.spellings[i] + "'";
    out += "\n";
  }
  return out;
}

}  // namespace cachet::cli
