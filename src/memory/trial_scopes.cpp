// The per-thread scopes a trial sets around its steps (memory_backend.h: UntrackedCpuScope,
// CpuInterruptScope, setBudgetBackendScope) and the questions the CPU budget allocator asks of them
// at each allocation (budget_host.h). LibTorch-free, so that the Python package's torch-free core
// (autobatch._core) owns this state on every device: `_drain_autograd` enters an untracked scope
// on CUDA too, and the search's deadline arms the interrupt hook whether or not the budget
// allocator is ever built (src/python/budget_module.cpp reaches it through budget_host.h).
#include <functional>

#include "memory/budget_host.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {
namespace {

thread_local int t_untracked_depth = 0;
// Inside a collective's call on this thread (setBudgetBackendScope): allocations set apart.
thread_local bool t_backend_scope = false;
// CpuInterruptScope: the hook armed on this thread, whether it fired, and whether it is running
// (an allocation from inside the hook is not checked again).
thread_local const std::function<bool()>* t_interrupt = nullptr;
thread_local bool t_interrupt_fired = false;
thread_local bool t_in_interrupt_hook = false;
thread_local bool t_interrupt_active = false;

}  // namespace

UntrackedCpuScope::UntrackedCpuScope() { ++t_untracked_depth; }
UntrackedCpuScope::~UntrackedCpuScope() { --t_untracked_depth; }

CpuInterruptScope::CpuInterruptScope(const std::function<bool()>& hook, bool active) {
  t_interrupt = hook ? &hook : nullptr;
  t_interrupt_fired = false;
  t_interrupt_active = active;
}
CpuInterruptScope::~CpuInterruptScope() {
  t_interrupt = nullptr;
  t_interrupt_active = false;
  t_interrupt_fired = false;  // outside a scope no error is an interruption (a later warm-up's)
}
void setInterruptActive(bool active) { t_interrupt_active = active; }

bool interruptRequested() { return t_interrupt != nullptr && (*t_interrupt)(); }
// False outside a scope: the scope's end clears it.
bool interruptFired() { return t_interrupt_fired; }

void setBudgetBackendScope(bool inside) { t_backend_scope = inside; }

bool budgetUntracked() { return t_untracked_depth > 0; }

bool budgetBackendScope() { return t_backend_scope; }

bool budgetInterruptDue() {
  if (t_interrupt == nullptr || !t_interrupt_active || t_in_interrupt_hook) return false;
  bool stop = false;
  t_in_interrupt_hook = true;
  try {
    stop = (*t_interrupt)();
  } catch (...) {
    // A hook that cannot answer (the caller's cancellation raised a Python error) stops the
    // step: running on past a deadline nobody can check is the worse outcome, and the C table of
    // budget_host.h lets no exception through.
    stop = true;
  }
  t_in_interrupt_hook = false;
  if (stop) t_interrupt_fired = true;
  return stop;
}

const AutobatchBudgetHost* budgetHost() {
  static const AutobatchBudgetHost host{
      kBudgetHostVersion,
      [] { return budgetUntracked() ? 1 : 0; },
      [] { return budgetInterruptDue() ? 1 : 0; },
      [] { return budgetBackendScope() ? 1 : 0; },
  };
  return &host;
}

}  // namespace autobatch::detail
