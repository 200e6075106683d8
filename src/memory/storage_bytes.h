// storage_bytes.h (internal) — the bytes of the distinct storages a set of tensors holds: what
// keeping them alive costs, each storage counted once however many tensors view it (tied
// weights, views, an output returned twice). Used by the trial runner (the caller's CPU weights
// allocated before the budget allocator) and the TorchScript step (the bytes of a step's output).
// Thread safety: one thread at a time per object.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <unordered_set>

namespace autobatch::detail {

class DistinctStorages {
 public:
  /// Which storages count (by data pointer); a storage that does not count is still remembered
  /// as seen. Null: every storage counts.
  using Filter = bool (*)(const void* data);

  explicit DistinctStorages(Filter counts = nullptr) : counts_(counts) {}

  /// Adds the bytes of `t`'s storage (c10::Storage::nbytes(), the whole storage, not the view)
  /// the first time its data pointer is seen. Undefined tensors, tensors without storage and
  /// storages without data add nothing.
  void add(const at::Tensor& t);
  /// The sum so far, in bytes (>= 0).
  std::int64_t bytes() const { return bytes_; }

 private:
  Filter counts_;
  std::unordered_set<const void*> seen_;
  std::int64_t bytes_ = 0;
};

}  // namespace autobatch::detail
