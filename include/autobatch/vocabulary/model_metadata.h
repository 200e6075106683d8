// autobatch/vocabulary/model_metadata.h — the description a model archive can carry of its own
// inputs.
//
// A TorchScript archive saved with
//     torch.jit.save(m, "net.pt", _extra_files={"autobatch/inputs.json": json.dumps({...})})
// carries the input specs and the loss kind, so `autobatch --model net.pt` needs no --input flag.
// Schema (version 1, see docs/inputs.md):
//     {
//       "version": 1,                       // optional; only 1 is known
//       "inputs": [                          // required, one entry per forward argument, in order
//         "3x224x224",                       //   an input spec in the CLI syntax, or
//         {"shape": [512], "dtype": "int64", "low": 0, "high": 32000}   // its object form
//       ],
//       "loss": "cross-entropy"              // optional: mean | cross-entropy | mse | model
//     }
// Object form: "shape" required (list of positive integers, [] for a scalar sample); "dtype"
// default "float32"; "low" default 0 and "high" default 2, integer dtypes only. Unknown keys are
// errors (a typo must not silently fall back to a default).
// This header and its parser include no LibTorch header (fuzzed without LibTorch).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/training_spec.h"

namespace autobatch {

/// Name of the extra file inside the TorchScript archive.
inline constexpr std::string_view kModelMetadataFile = "autobatch/inputs.json";

/// What an archive says about itself.
struct ModelMetadata {
  /// One spec per forward argument; never empty after parseModelMetadata.
  std::vector<InputSpec> inputs;
  /// The loss kind, when the archive names one.
  std::optional<LossKind> loss;

  bool operator==(const ModelMetadata&) const = default;
};

/// Parses the JSON text of "autobatch/inputs.json". `origin` names the source in error messages
/// (e.g. the model path). Throws: autobatch::Error "<origin>: autobatch/inputs.json: expected ...,
/// but got ..." for invalid JSON, a missing or empty "inputs", a bad spec, an unknown key, dtype or
/// loss, or an unsupported version. Thread safety: pure function.
ModelMetadata parseModelMetadata(std::string_view json_text, std::string_view origin = "model");

/// The JSON text parseModelMetadata reads back (object form, version 1).
std::string toJson(const ModelMetadata& metadata);

/// Combines explicit settings with the archive's: explicit inputs (non-empty) win over the
/// archive's, an explicit loss over the archive's, and the loss falls back to LossKind::kMean.
/// `metadata` is nullopt when the archive has no "autobatch/inputs.json".
/// Throws: autobatch::Error when neither gives inputs, naming both ways to provide them
/// (the --input flag / TrainingSpec::inputs, and the archive's extra file, with a Python example).
std::pair<std::vector<InputSpec>, LossKind> resolveInputs(
    const std::vector<InputSpec>& explicit_inputs, std::optional<LossKind> explicit_loss,
    const std::optional<ModelMetadata>& metadata, std::string_view model_path);

/// How to turn a PyTorch model into what autobatch loads; appended to model-file errors.
inline constexpr std::string_view kExportAdvice =
    "autobatch reads a TorchScript archive or a pt2 training-step package: export with "
    "torch.jit.script(model).save(path) (or torch.jit.trace(model, example_inputs).save(path)), "
    "or with scripts/autobatch_export.py, which also stores the input specs (--format pt2 for a "
    "package); a torch.save(model) or torch.save(model.state_dict()) file is neither";

/// Checks that `path` can be a model file before LibTorch reads it: it exists, is a regular file,
/// is readable, is not empty, starts with a zip signature ("PK\3\4"), as every torch.jit.save
/// archive and every pt2 package does, and is a whole zip archive: its central directory reads,
/// and every member's data has the CRC-32 and sizes the directory records (LibTorch's reader
/// checks neither; issue 27). Reads the whole file once.
/// Throws: autobatch::Error naming the path, what was expected, what was found and how to export
/// a model (kExportAdvice where it applies); a damaged archive is "package damaged" (its members
/// are a pt2 package's, also when only the start of the file is left) or "archive damaged",
/// naming the damaged member.
void checkModelFile(const std::string& path);

}  // namespace autobatch
