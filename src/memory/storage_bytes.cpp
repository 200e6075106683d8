#include "memory/storage_bytes.h"

namespace autobatch::detail {

void DistinctStorages::add(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const void* data = t.storage().data();
  if (data == nullptr || !seen_.insert(data).second) return;
  if (counts_ != nullptr && !counts_(data)) return;
  bytes_ += static_cast<std::int64_t>(t.storage().nbytes());
}

}  // namespace autobatch::detail
