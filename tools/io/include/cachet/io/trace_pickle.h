// cachet/io/trace_pickle.h: the pickled snapshot's mapping into a TraceFile
// (src/trace_pickle.cpp): torch.cuda.memory._dump_snapshot() output, or a pickled
// memory_snapshot() list (segments only). Bytes already gunzipped; bad input throws ReadError.
#pragma once

#include <string_view>

#include "cachet/io/trace_file.h"

namespace cachet::io {

TraceFile parse_snapshot_pickle(std::string_view bytes, std::string_view name);

}  // namespace cachet::io
