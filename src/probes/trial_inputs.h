// trial_inputs.h (internal) — the synthetic inputs of a trial's micro-batches: their dtype, their
// bytes checked against the room under the limit before any is allocated, and their values
// (integers uniform in [low, high), floats standard normal). Thread safety: none needed.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/training_spec.h"

namespace autobatch::detail {

/// The ATen dtype of `dtype`.
at::ScalarType toScalarType(DType dtype);

/// The model's float type under `precision`: fp16 / bf16 cast the model; every other precision
/// keeps it in float32.
at::ScalarType modelFloatType(Precision precision);

/// The dtype an input is fed in: a float32 input of an fp16/bf16 model in the model's, as the
/// job would; any other input in its own.
at::ScalarType inputType(const InputSpec& input, Precision precision);

/// Sizes a micro-batch's inputs (and the targets a format takes as inputs) at `batch` samples
/// before any is allocated. When their bytes pass INT64_MAX or `budget_bytes - in_use_bytes`,
/// throws c10::OutOfMemoryError (a trial result like any refused allocation; issue 27, row 13).
void checkInputBytes(std::int64_t batch, const std::vector<InputSpec>& inputs,
                     const std::vector<InputSpec>& targets, Precision precision,
                     std::int64_t in_use_bytes, std::int64_t budget_bytes);

/// One input of `batch` samples, shape [batch, sample_shape...], in inputType(input, precision),
/// drawn from `gen` on the CPU and moved to `device`. Side effects: allocates its bytes.
at::Tensor makeInput(const InputSpec& input, std::int64_t batch, Precision precision,
                     const at::Device& device, at::Generator& gen);

}  // namespace autobatch::detail
