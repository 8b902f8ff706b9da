// The compact, lossless encoding of stats changes in a dump's "s" field (stats_codec.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/stats.h"

namespace cachet::behaviour {

// flatten(s)'s values, in its key order (stat_key_names()).
std::vector<std::int64_t> stat_values(const DeviceStats& s);
const std::vector<std::string>& stat_key_names();
// The "s" field (each token preceded by a space; empty when nothing changed).
std::string encode_stats(const std::vector<std::int64_t>& before, const std::vector<std::int64_t>& after);
// Applies a field (tokens separated by spaces) to `values` (resized to the key count when empty).
void decode_stats(std::string_view field, std::vector<std::int64_t>& values);

}  // namespace cachet::behaviour
