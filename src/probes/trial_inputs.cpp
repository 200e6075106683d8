// The synthetic inputs of a trial's micro-batches (trial_inputs.h).
#include "probes/trial_inputs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>

namespace autobatch::detail {

at::ScalarType toScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kInt64:
      return at::kLong;
    case DType::kInt32:
      return at::kInt;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

at::ScalarType modelFloatType(Precision precision) {
  if (precision == Precision::kFp16) return at::kHalf;
  if (precision == Precision::kBf16) return at::kBFloat16;
  return at::kFloat;
}

at::ScalarType inputType(const InputSpec& input, Precision precision) {
  const at::ScalarType type = toScalarType(input.dtype);
  return type == at::kFloat ? modelFloatType(precision) : type;
}

// The one place a micro-batch's inputs are sized: ATen would otherwise throw "Storage size
// calculation overflowed" (exit 1 for --check-batch 1099511627776 at 3x1024x1024), and a size
// near 2^63 reached the allocator ("bool:9223372036854775807": exit 1 with a C++ backtrace; issue
// 27, row 13). The inputs alone needing more than the limit is a sound out of memory for the batch.
void checkInputBytes(std::int64_t batch, const std::vector<InputSpec>& inputs,
                     const std::vector<InputSpec>& targets, Precision precision,
                     std::int64_t in_use_bytes, std::int64_t budget_bytes) {
  std::int64_t total = 0;
  bool overflows = false;
  auto add = [&](const InputSpec& input) {
    const auto bytes = batchBytes(
        input, batch, static_cast<std::int64_t>(c10::elementSize(inputType(input, precision))));
    if (!bytes || *bytes > std::numeric_limits<std::int64_t>::max() - total) {
      overflows = true;
    } else {
      total += *bytes;
    }
  };
  for (const auto& input : inputs) add(input);
  for (const auto& target : targets) add(target);
  if (!overflows && total <= budget_bytes - in_use_bytes) return;
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "out of memory: the inputs of micro-batch ", batch,
      " would allocate ", overflows ? std::numeric_limits<std::int64_t>::max() : total,
      " bytes with ", in_use_bytes, " bytes in use under a limit of ", budget_bytes, " bytes",
      overflows ? " (more than that: their size passes 2^63 - 1 bytes), so no allocator can "
                  "hold them"
                : "; not allocated");
}

at::Tensor makeInput(const InputSpec& input, std::int64_t batch, Precision precision,
                     const at::Device& device, at::Generator& gen) {
  std::vector<std::int64_t> shape{batch};
  shape.insert(shape.end(), input.sample_shape.begin(), input.sample_shape.end());
  const at::ScalarType type = inputType(input, precision);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  if (isIntegral(input.dtype)) {
    t.random_(input.low, input.high, gen);
  } else {
    t.normal_(0.0, 1.0, gen);
  }
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace autobatch::detail
