#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "common/check.h"
#include "zero/shard.h"

namespace zs::zero {
namespace {

// Reference: DeepSpeed's zero3_partitioned_param_info: ceil(numel/world) per rank,
// padding = world * per_rank - numel, all of it on the last ranks.
TEST(Stage3Shard, CoversEveryElementOnceWithPaddingAtTheEnd) {
  for (int64_t numel : {0, 1, 7, 8, 9, 1000, 1001}) {
    for (int world : {1, 2, 3, 4, 8}) {
      const int64_t per_rank = (numel + world - 1) / world;
      int64_t valid_total = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = stage3_param_shard(numel, world, r);
        EXPECT_EQ(s.numel, per_rank);
        EXPECT_EQ(s.begin, per_rank * r);
        valid_total += s.valid;
        if (s.valid < s.numel) {
          // Once a rank is short, every later rank holds no data.
          for (int later = r + 1; later < world; ++later) {
            EXPECT_EQ(stage3_param_shard(numel, world, later).valid, 0);
          }
        }
      }
      EXPECT_EQ(valid_total, numel) << "numel=" << numel << " world=" << world;
    }
  }
}

TEST(Stage12Partition, PadsToTwiceWorldAndSplitsEvenly) {
  EXPECT_EQ(stage12_padded_numel(10, 4), 16);
  EXPECT_EQ(stage12_padded_numel(16, 4), 16);
  EXPECT_EQ(stage12_padded_numel(1, 1), 2);
  const ShardRange last = stage12_partition(10, 4, 3);
  EXPECT_EQ(last.begin, 12);
  EXPECT_EQ(last.numel, 4);
  EXPECT_EQ(last.valid, 0);
  const ShardRange second = stage12_partition(10, 4, 2);
  EXPECT_EQ(second.valid, 2);
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// `call` throws zs::ValueError (Python's ValueError) whose message holds every `part`.
void expect_value_error(const std::function<void()>& call,
                        std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "no ValueError; expected one naming " << *parts.begin();
  } catch (const ValueError& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Shard, RejectsBadRank) {
  expect_value_error([] { stage3_param_shard(10, 2, 2); }, {"rank 2", "world 2"});
  expect_value_error([] { stage3_param_shard(10, 2, -1); }, {"rank -1"});
  expect_value_error([] { stage12_partition(10, 0, 0); }, {"world must be > 0; got 0"});
}

// Each of these was reachable from Python: world 0 divided by zero (SIGFPE), and the others
// returned a negative or zero padded size instead of an error.
TEST(Stage12Partition, BadArgumentsAreValueErrorsNamingTheArgument) {
  expect_value_error([] { stage12_padded_numel(10, 0); }, {"world must be > 0; got 0"});
  expect_value_error([] { stage12_padded_numel(10, -4); }, {"world must be > 0; got -4"});
  expect_value_error([] { stage12_padded_numel(-5, 4); }, {"numel must be >= 0; got -5"});
  expect_value_error([] { stage12_padded_numel(-100, 1); }, {"numel must be >= 0; got -100"});
  expect_value_error([] { stage12_padded_numel(10, 4, 0); }, {"alignment must be > 0; got 0"});
  expect_value_error([] { stage12_padded_numel(10, 4, -2); }, {"alignment must be > 0; got -2"});
  expect_value_error([] { stage12_partition(-1, 4, 0); }, {"numel must be >= 0; got -1"});
  expect_value_error([] { stage12_partition(10, 4, 4); }, {"rank 4", "world 4"});
}

TEST(Stage12Partition, PaddingBeyondInt64IsAnErrorNotANegativeSize) {
  expect_value_error([] { stage12_padded_numel(kMax, 4); },
                     {"numel 9223372036854775807", "alignment * world = 8", "64-bit"});
  expect_value_error([] { stage12_partition(kMax, 4, 3); }, {"numel 9223372036854775807"});
  // The largest multiple of the unit still fits, and so do the largest units.
  const int64_t top = kMax / 8 * 8;
  EXPECT_EQ(stage12_padded_numel(top, 4), top);
  EXPECT_EQ(stage12_padded_numel(top - 1, 4), top);
  const int big = std::numeric_limits<int>::max();
  EXPECT_EQ(stage12_padded_numel(10, big, big), int64_t{big} * big);
  const ShardRange last = stage12_partition(top - 1, 4, 3);
  EXPECT_GE(last.begin, 0);
  EXPECT_EQ(last.begin + last.numel, top);
  EXPECT_EQ(last.valid, last.numel - 1);
}

TEST(Stage3Shard, BadArgumentsAndPaddingBeyondInt64AreValueErrors) {
  expect_value_error([] { stage3_param_shard(-1, 2, 0); }, {"numel must be >= 0; got -1"});
  expect_value_error([] { stage3_param_shard(10, 0, 0); }, {"world must be > 0; got 0"});
  // ceil(numel / world) * world wrapped negative: (0, -2305843009213693951, ...) before.
  expect_value_error([] { stage3_param_shard(kMax, 4, 0); }, {"numel 9223372036854775807"});
  const int big = std::numeric_limits<int>::max();
  expect_value_error([] { stage3_param_shard(kMax, big, 3); }, {"numel 9223372036854775807"});
  // kMax is a multiple of 7 (2^63 - 1 = 7 * 73 * ...): no padding, so it fits.
  const ShardRange last = stage3_param_shard(kMax, 7, 6);
  EXPECT_EQ(last.begin + last.numel, kMax);
  EXPECT_EQ(last.valid, last.numel);
}

}  // namespace
}  // namespace zs::zero
