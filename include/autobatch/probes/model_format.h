// autobatch/probes/model_format.h — what each model format autobatch runs is and can do.
//
// Contract: one description per format (a TorchScript archive; a pt2 training-step package from
// scripts/autobatch_export.py --format pt2, docs/formats.md), read by the CLI's checks (--device
// auto, --lengths, --keep-output) and by the trial runner (device, mixed trials) alike, so that a
// rule such as "pt2 runs on the CPU only" is written once. The descriptions are constants that
// live as long as the program; modelFormatAt() reads only a file's zip directory.
// Thread safety: every function may be called from any thread.
// This header includes no LibTorch header.
#pragma once

#include <string>
#include <string_view>

namespace autobatch {

/// What a model format's step can do beyond one training micro-step at batch B.
struct FormatCapabilities {
  /// A forward alone (no loss, no backward) can run: evaluation batches, which a later issue
  /// sizes. TorchScript: true. pt2: false (the package holds the training step only).
  bool evaluation_forward = false;
  /// The input shapes may differ from one optimizer step to the next within a trial
  /// (TrialRunner::runMixed, the length sweep's mixed verification). TorchScript: true. pt2: false
  /// (its shapes are fixed at export).
  bool varying_shapes = false;
  /// Forward, loss and backward are one call that adds the gradients into the parameters' .grad
  /// itself (phases "inputs", "forward-backward", "optimizer-step"). pt2: true (docs/formats.md,
  /// "How a package runs"). TorchScript: false (forward, loss and backward are phases of their
  /// own; autograd accumulates).
  bool accumulates_in_call = false;
};

/// One model format.
struct ModelFormat {
  /// "torchscript" or "pt2": the JSON's model.format and TrialRunner::modelFormat().
  std::string_view name;
  /// What messages call a file of this format: "archive" or "package" ("model package '...'").
  std::string_view file_kind;
  /// Runs on the CPU only: --device auto picks the CPU for it and another device is a usage
  /// error. pt2: true until a GPU has run a package.
  bool cpu_only = false;
  /// Why it is CPU-only, said after the refusal; "" when cpu_only is false.
  std::string_view cpu_only_reason;
  /// The inputs, the loss and the precision are fixed by the file (pt2: at export); flags may only
  /// repeat them. TorchScript: false (flags, else the archive's autobatch/inputs.json).
  bool inputs_fixed = false;
  /// The step returns the model's output, which a training loop can keep through backward
  /// (--keep-output yes). pt2: false (its call returns the loss and the gradients only).
  bool returns_output = true;
  FormatCapabilities capabilities;
};

/// The TorchScript format (torch.jit.save archives; torch::jit::Module given in memory).
const ModelFormat& torchScriptFormat();

/// The pt2 format: an AOTInductor package of one training step (docs/formats.md).
const ModelFormat& pt2Format();

/// The format of the model file at `path`: pt2Format() when `path` names a regular file that is a
/// zip archive with a data/aotinductor/ entry (an AOTInductor package, whoever wrote it; its
/// metadata is checked when it is loaded), else torchScriptFormat() (also for "", a missing file
/// or a folder: the TorchScript loader's checks explain those). Reads the archive's directory only.
/// Throws: std::filesystem::filesystem_error when the path's status cannot be read for another
/// reason than its absence (a folder on the way without search permission).
const ModelFormat& modelFormatAt(const std::string& path);

}  // namespace autobatch
