// pt2_metadata.h (internal) — the records of a pt2 package that describe it without its code:
// the batch range the compiled code is valid for and the export's memory check (readPt2Metadata,
// declared in pt2_package.h, reads the "autobatch" metadata itself).
#pragma once

#include <string>

#include "pt2_package.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}  // namespace caffe2::serialize

namespace autobatch::detail {

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
