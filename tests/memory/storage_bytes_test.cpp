// The distinct-storage byte count (src/memory/storage_bytes.h, internal).
#include "memory/storage_bytes.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace autobatch::detail {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace storage_bytes_test {

// Catches a count per tensor instead of per storage: a view and a second handle of one storage
// would add its bytes three times (3 * 400), and a narrowed view only its own 40 bytes.
TEST(DistinctStoragesTest, CountsEachStorageOnceWholeAcrossViews) {
  const at::Tensor a = at::zeros({100}, at::kFloat);  // 400 bytes
  const at::Tensor b = at::zeros({10}, at::kDouble);  // 80 bytes
  DistinctStorages storages;
  storages.add(a.narrow(0, 0, 10));
  storages.add(a);
  storages.add(a.view({10, 10}));
  storages.add(b);
  storages.add(at::Tensor());  // undefined: nothing
  EXPECT_EQ(storages.bytes(), 480);
}

// Catches a filter that is ignored (480) or one that forgets the storages it refused, counting a
// refused storage when a second view of it comes along.
TEST(DistinctStoragesTest, FilterRefusesStoragesWithoutCountingThemLater) {
  static const void* refused = nullptr;
  const at::Tensor a = at::zeros({100}, at::kFloat);
  const at::Tensor b = at::zeros({10}, at::kDouble);
  refused = a.storage().data();
  DistinctStorages storages([](const void* data) { return data != refused; });
  storages.add(a);
  storages.add(a.view({10, 10}));
  storages.add(b);
  EXPECT_EQ(storages.bytes(), 80);
}

}  // namespace storage_bytes_test
}  // namespace
}  // namespace autobatch::detail
