// The extra fields of the private-pool recordings (tests/data/oracle-h100/README.md;
// docs/pytorch-allocator.md §14): pool ids, segment pool ids, live MemPools, as a JSON tool reads
// them from the shipped files. (The pool ops themselves: ops_reader_test.)
#include <gtest/gtest.h>

#include <string>

#include "cachet/io/recording.h"

namespace cachet::io {
namespace {

const std::string kH100 = std::string(CACHET_TEST_DATA) + "/oracle-h100/";

TEST(PoolRecordings, ReadsPoolIdsAndSegmentPools) {
  const Recording r = read_recording(kH100 + "results/res_graphs_default.json.gz");
  ASSERT_GE(r.pool_ids.size(), 3u);
  EXPECT_EQ(r.pool_ids[0].name, "g0");
  EXPECT_EQ(r.pool_ids[0].id, (PoolId{1, 0}));
  EXPECT_EQ(r.pool_ids[1].name, "g2");
  EXPECT_EQ(r.pool_ids[1].id, (PoolId{1, 0}));  // shares graph 0's pool
  EXPECT_EQ(r.pool_ids[2].id, (PoolId{2, 0}));
  ASSERT_EQ(r.segments.size(), 84u);
  EXPECT_EQ(r.segments[0].pool_id, (PoolId{30, 0}));
  EXPECT_TRUE(r.errors.empty());
  const Recording p = read_recording(kH100 + "results/res_pools_default.json.gz");
  ASSERT_EQ(p.live_pools.size(), 3u);
  EXPECT_EQ(p.live_pools[0].k, 1u);
  EXPECT_EQ(p.live_pools[0].id, (PoolId{0, 35}));
  EXPECT_EQ(p.live_pools[0].use_count, 1);
}

}  // namespace
}  // namespace cachet::io
