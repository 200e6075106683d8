// An evaluation forward whose values live as long as CPython would keep them (docs/evaluation.md,
// "Python lifetimes"): under no-grad the TorchScript interpreter frees every value at its last
// use, while a Python frame keeps a value bound to a local name until the name is rebound or the
// frame returns, and keeps a call's arguments until the call returns. For decoder_lm_small's
// `return self.head(self.ln(x))` the difference is `x` while the logits are made (1.05% of the
// evaluation peak at E=16). Training is unaffected: there both keep such values for backward.
#pragma once

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include <cstdint>
#include <memory>

namespace autobatch::detail {

/// The transformed forward and what the transformation found.
struct PythonLifetimeForward {
  /// Runs `module.forward`'s code, inlined, with `autobatch::keep_alive` uses where a Python
  /// frame holds a value longer than the interpreter would. Inputs: the module's object
  /// (`module._ivalue()`), then forward's arguments (defaults already filled in); outputs: the
  /// forward's. Never null.
  std::unique_ptr<torch::jit::GraphFunction> function;
  std::int64_t kept_values = 0;  ///< tensor values given a later use, counted once per use site
};

/// Builds the forward of `module` with Python's lifetimes:
/// - a tensor value bound to a local name (the graph's debug name, less a trailing number: the
///   compiler's `x.3` and the serialized code's `x0` both mean the local `x`; unnamed values and
///   the printer's temporaries `_N` are not locals) lives until the same name is bound again in
///   the same frame instance and block, else to the end of that frame (the last node of the
///   inlined call; the top frame: the return);
/// - a tensor passed to a method or function call lives at least until that call returns.
/// Traced graphs name few of their values after Python locals (docs/evaluation.md): the caller
/// should not use this on an archive known to be traced.
/// The module is not changed; the function holds a copy of its graph (the module's type must
/// outlive it).
/// Throws: c10::Error when the module has no forward method.
PythonLifetimeForward pythonLifetimeForward(const torch::jit::Module& module);

}  // namespace autobatch::detail
