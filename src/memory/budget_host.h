// Internal: the calls the CPU budget allocator (cpu_budget.cpp) makes into the per-thread trial
// scopes (trial_scopes.cpp), as a table of plain C functions. LibTorch-free.
//
// Why a table: in the command both files are linked into libautobatch and the allocator calls
// budgetUntracked() and the others directly. In the Python package the allocator is a separate
// extension compiled on first use against the environment's torch (src/python/budget_module.cpp,
// autobatch/_budget.py), while the scopes live in autobatch._core, built once for every torch. The
// two modules may be compiled with different C++ ABIs (torch 2.6's wheels use
// _GLIBCXX_USE_CXX11_ABI=0, our wheel the new ABI), so nothing but C types crosses: no std::string,
// no std::function, no exception (each call is noexcept and answers 0 or 1).
#pragma once

#include <cstdint>

extern "C" {

/// Version of AutobatchBudgetHost's layout; a budget module built for another refuses to load.
inline constexpr std::uint32_t kBudgetHostVersion = 1;

/// The per-thread answers the budget allocator needs at each allocation, for the calling thread.
struct AutobatchBudgetHost {
  std::uint32_t version;  ///< kBudgetHostVersion
  /// 1 inside an UntrackedCpuScope (the allocation is not counted).
  int (*untracked)();
  /// 1 when the CpuInterruptScope armed on this thread is active and its hook asks to stop (a hook
  /// that throws asks to stop); interruptFired() is true from then on. 0 when none is armed.
  int (*interrupt_due)();
  /// 1 inside setBudgetBackendScope(true) (the allocation is set apart from the own peak).
  int (*backend_scope)();
};

}  // extern "C"

namespace autobatch::detail {

/// The calls above for the calling thread (trial_scopes.cpp in the command and in autobatch._core;
/// in the Python package's budget module they forward to the host table it was given).
bool budgetUntracked();
bool budgetInterruptDue();
bool budgetBackendScope();

/// The table over this process's scopes (trial_scopes.cpp): what autobatch._core hands to the
/// budget module (as the capsule "autobatch._core.budget_host"). Never null; lives forever.
const AutobatchBudgetHost* budgetHost();

}  // namespace autobatch::detail
