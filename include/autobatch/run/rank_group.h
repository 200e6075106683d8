// autobatch/run/rank_group.h — the ranks of a multi-rank preflight agree on one micro-batch through
// LibTorch's c10d TCPStore, under a PrefixStore of ours.
//
// Contract: the constructor connects to the store (rank 0 hosts it at master_port, or, under
// torchrun with TORCHELASTIC_USE_AGENT_STORE=True, every rank is a client of the agent's store)
// and starts a heartbeat thread (key "hb/<rank>", a counter, every heartbeat_interval_s).
// exchange() publishes this rank's RankReport ("result/<rank>"), waits for every rank's, and
// returns agree(). A rank whose result is missing and whose heartbeat has not advanced for
// timeout_s (counted from when this rank started waiting) is dead or hung: RankError names it.
// A slow rank, still beating, is waited for. Nothing blocks longer than timeout_s on one rank.
// No NCCL/Gloo collective is used (their timeouts abort the process instead of raising).
// This header includes no LibTorch header. Thread safety: one thread uses a RankGroup; the
// heartbeat thread is internal and stopped by the destructor.
#pragma once

#include <memory>
#include <string>

#include "autobatch/run/ranks.h"

namespace autobatch {

struct RankGroupOptions {
  /// Seconds to reach the store, and seconds a rank may stay silent (no result, no new
  /// heartbeat) before the others give up with RankError. > 0. Default: 300 (--rank-timeout).
  double timeout_s = 300.0;
  /// Seconds between heartbeats. > 0. Default: 1 (tests use less).
  double heartbeat_interval_s = 1.0;
  /// Key prefix of our PrefixStore; TORCHELASTIC_RESTART_COUNT is appended by the CLI so that a
  /// restarted job does not read the last attempt's keys from the agent's store.
  /// Default: "autobatch/preflight".
  std::string prefix = "autobatch/preflight";
  /// This autobatch's version, stamped on what the rank publishes (a rank of another version is
  /// named with both). Default: "" (unknown).
  std::string version;
};

class RankGroup {
 public:
  /// Connects and starts heartbeats. Throws: RankError when the store cannot be hosted (port in
  /// use) or reached within timeout_s; autobatch::Error for options out of range.
  RankGroup(const RankInfo& info, const RankGroupOptions& options);
  /// Stops the heartbeat thread. Never throws.
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  /// The job round, right after connecting and before any trial: publishes `mine` (what this
  /// rank's plan depends on: the model's hash, the flags that change the plan, the version),
  /// waits for every rank's, and compares them (compareJobRecords). Every rank sees the same
  /// records, so a difference ends every rank. Throws: RankError (a field or the version differs,
  /// naming the field, the ranks and both values; a rank died, failed or runs an autobatch without
  /// this round).
  void compareJob(const JobFields& mine);

  /// Publishes `report` (stamped with this autobatch's version and protocol), waits for every
  /// rank's report and returns their agreement (the minimum).
  /// The rank hosting the store then waits (at most timeout_s) until every rank has read the
  /// reports, so that it does not take the store away from a rank still reading.
  /// Throws: RankError (dead, missing or failed ranks, lost store), with the ranks named.
  Agreement exchange(const RankReport& report);

  /// Publishes a failure `status` for this rank so that the others stop waiting at once (they
  /// fail with RankError naming this rank). Best effort: never throws.
  void abandon(const std::string& status) noexcept;

  /// "rank 0 of 4 (torchrun), store 127.0.0.1:29500 hosted by rank 0"
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace autobatch
