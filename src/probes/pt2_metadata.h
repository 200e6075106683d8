// pt2_metadata.h (internal) — what describes a pt2 package without its code (pt2_package.h loads
// the code): the "autobatch" metadata scripts/autobatch_export.py writes, the batch range the
// compiled code is valid for and the export's memory check.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/training_spec.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}  // namespace caffe2::serialize

namespace autobatch::detail {

/// What scripts/autobatch_export.py wrote into the package's "autobatch" metadata (JSON).
struct Pt2Metadata {
  std::vector<InputSpec> inputs;   ///< one per model input, batch dimension left out
  std::vector<InputSpec> targets;  ///< the loss's targets, package inputs after the model's
  LossKind loss = LossKind::kMean;
  std::vector<std::string>
      gradients;  ///< parameter names, in the call's output order (after the loss)
  std::vector<std::string> parameters;  ///< every parameter name (tied copies included)
  std::vector<std::string> buffers;
  /// Names of one parameter in the original model; the first is the stored one.
  std::vector<std::vector<std::string>> tied;
  std::string torch_version;  ///< e.g. "2.11.0"
  std::string precision;      ///< "fp32"
  std::string cpu_isa;        ///< AOTInductor's AOTI_CPU_ISA, e.g. "AVX512 AVX512_VNNI"; "" unknown
  /// The package's second model, the same step adding each gradient into a buffer
  /// ("autobatch_grad.<parameter>") instead of returning it; "" in packages without one.
  std::string accumulate_model;
  /// Each stored tensor's shape and dtype (c10::toString, e.g. "Float"; "" unchecked) as the
  /// compiled code reads it; empty in packages written before this field.
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::string>> tensors;
  /// The batch sizes the compiled code is valid for (data/autobatch/batch_range.json: what
  /// Inductor's guards left of Dim("B"); the package computes wrong values outside it). A low of 2
  /// is torch.export's own bound and batch 1 runs; batch_high 0: no upper bound.
  std::int64_t batch_low = 1;
  std::int64_t batch_high = 0;
  /// What the model's eager step raised at batch 1 when it was exported (batch_range.json
  /// "eager_batch1_error", e.g. BatchNorm's "Expected more than 1 value per channel when
  /// training"); "" when it ran. torch.export traces at batch >= 2, so such a check is not in the
  /// compiled code: the runner fails batch 1 with this message, as the eager job would.
  std::string eager_batch1_error;
  /// True when the metadata lists "eager_kernels": the package calls ATen's own kernels for the
  /// loss, normalisations, activations, pooling and CPU attention, compiled in autograd's order
  /// (scripts/autobatch_export.py EAGER_KERNELS), so its peaks are the eager step's. False in
  /// packages exported before that, where Inductor fused them: their peaks were 0-17% under an
  /// eager loop's (docs/formats.md).
  bool eager_kernels = false;
  /// The export's check of the package's peaks against the eager step's
  /// (data/autobatch/memory_check.json, scripts/autobatch_export.py memory_check, issue 26):
  /// "passed" (within -0.5% / +1% at each batch, or 64 KiB), "over" (over by more than 1% at some
  /// batch), "not-run" (memory_check_reason says why), "" when the package has no such record
  /// (exported before the check).
  std::string memory_check;
  std::string memory_check_reason;
  /// Its rows: the batch, the eager step's peak and the package's (bytes).
  struct MemoryCheckRow {
    std::int64_t batch = 0;
    std::int64_t eager_peak_bytes = 0;
    std::int64_t package_peak_bytes = 0;
  };
  std::vector<MemoryCheckRow> memory_check_rows;
};

/// Reads and checks the package's metadata without loading its code. Throws autobatch::Error
/// naming the cause: not written by autobatch_export.py --format pt2 (an inference-only package,
/// no "autobatch" metadata), a bad metadata field, another torch version than this LibTorch's, an
/// instruction set this CPU lacks, a precision other than fp32.
Pt2Metadata readPt2Metadata(const std::string& path);

/// Reads data/autobatch/batch_range.json, when the package has it, into `metadata`'s batch_low,
/// batch_high and eager_batch1_error. Throws autobatch::Error for a malformed document or a high
/// under the low.
void readBatchRange(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader,
                    Pt2Metadata& metadata);

/// Reads data/autobatch/memory_check.json, when the package has it, into `metadata`'s
/// memory_check, memory_check_reason and memory_check_rows. Throws autobatch::Error for a
/// malformed document.
void readMemoryCheck(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader,
                     Pt2Metadata& metadata);

}  // namespace autobatch::detail
