#include "autobatch/vocabulary/search_options.h"

#include <array>

#include "vocabulary/name_table.h"

namespace autobatch {
namespace {

constexpr std::array<detail::NameEntry<Strategy>, 3> kStrategyNames{{
    {Strategy::kGuided, "guided"},
    {Strategy::kBinsearch, "binsearch"},
    {Strategy::kPower, "power"},
}};

constexpr std::array<detail::NameEntry<PlanKind>, 4> kPlanNames{{
    {PlanKind::kAuto, "auto"},
    {PlanKind::kUniform, "uniform"},
    {PlanKind::kBalanced, "balanced"},
    {PlanKind::kFastest, "fastest"},
}};

}  // namespace

std::string_view toString(Strategy strategy) { return detail::nameOf(kStrategyNames, strategy); }
Strategy parseStrategy(std::string_view name) {
  return detail::parseName(kStrategyNames, "strategy", name);
}

std::string_view toString(PlanKind kind) { return detail::nameOf(kPlanNames, kind); }
PlanKind parsePlanKind(std::string_view name) {
  return detail::parseName(kPlanNames, "plan", name);
}

std::vector<std::string_view> strategyNames() { return detail::canonicalNames(kStrategyNames); }
std::vector<std::string_view> planKindNames() { return detail::canonicalNames(kPlanNames); }

}  // namespace autobatch
