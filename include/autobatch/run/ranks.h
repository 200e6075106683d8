// autobatch/run/ranks.h — who this process is in a multi-rank job, and how the ranks' answers
// become one.
//
// LibTorch-free: environment parsing (torchrun, Slurm) and the agreement rule, tested without a
// store. The exchange itself is autobatch/run/rank_group.h. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace autobatch {

/// The ranks could not agree: a rank died, never arrived, failed, or the store was lost.
/// The CLI exits 4 on it. The message names the rank(s) and the timeout.
class RankError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Values given on the command line (--rank, --world-size, --local-rank, --master-addr,
/// --master-port); each one overrides the environment's.
struct RankFlags {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

/// This process's place in the job.
struct RankInfo {
  /// Global rank, in [0, world_size).
  int rank = 0;
  /// Data-parallel ranks. >= 1.
  int world_size = 1;
  /// Rank on this node: the GPU index (cuda:local_rank). >= 0.
  int local_rank = 0;
  /// Host of the store: MASTER_ADDR, else the first host of SLURM_JOB_NODELIST, else 127.0.0.1.
  std::string master_addr = "127.0.0.1";
  /// Where master_addr came from, for messages: "--master-addr", "MASTER_ADDR",
  /// "SLURM_JOB_NODELIST" or "default".
  std::string master_addr_origin = "default";
  /// Port of the store, in [1, 65535]: MASTER_PORT, else kSlurmPortBase + the last four digits of
  /// SLURM_JOB_ID under Slurm, else 29500 (torchrun's default).
  int master_port = 29500;
  /// torchrun with TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts the store, every rank is a
  /// client. Otherwise rank 0 hosts it.
  bool use_agent_store = false;
  /// Where the rank came from: "flags", "torchrun", "slurm", or "none" (a single process).
  std::string source = "none";

  /// True when the ranks must agree: a rank was given (flag or launcher) and world_size > 1.
  bool agrees() const { return source != "none" && world_size > 1; }
};

/// Reads one environment variable; nullopt when unset. processEnvironment() reads getenv.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup processEnvironment();

/// Under Slurm without MASTER_PORT: kSlurmPortBase + (SLURM_JOB_ID mod 10000), as PyTorch
/// Lightning's SLURMEnvironment does, so every task of a job computes the same port.
inline constexpr int kSlurmPortBase = 15000;

/// Resolves the rank from `flags`, then torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), then Slurm's (SLURM_PROCID,
/// SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST, SLURM_JOB_ID); each field separately.
/// The launcher is torchrun when RANK or WORLD_SIZE is set (not empty), else Slurm when
/// SLURM_PROCID or SLURM_NTASKS is; each of its variables is read on its own (WORLD_SIZE alone
/// is the world size; RANK alone a rank of world size 1). With neither, LOCAL_RANK (else
/// SLURM_LOCALID) is still the local rank. An empty variable counts as unset.
/// Throws: autobatch::Error (a usage error) naming the variable or flag for a non-number, a world
/// size < 1, a rank outside [0, world size), a negative local rank, a port outside [1, 65535],
/// or a store host that is no address or host name ("256.1.1.1", "a b").
/// A world size > 1 with no rank anywhere is a single process planning for that many ranks
/// (RankInfo::agrees() false), as `--world-size N` alone always was.
RankInfo resolveRankInfo(const RankFlags& flags, const EnvLookup& env);

/// The first host of a Slurm node list: "node[01-04,07],gpu5" -> "node01", "a,b" -> "a",
/// "gpu-[3,5]" -> "gpu-3". Throws: autobatch::Error for an empty list or unbalanced brackets.
std::string firstSlurmHost(std::string_view nodelist);

/// The device of this rank: "cuda" -> "cuda:<local_rank>"; any other value (cpu, cuda:N) as given.
std::string rankDevice(std::string_view device, int local_rank);

/// The version of what ranks publish in the store (the job round's fields and the reports): a
/// rank of another version is refused with both versions named (RankError), never misread.
/// Version 1 (no "protocol" key) had no job round.
inline constexpr int kRankProtocol = 2;

/// What every rank of one preflight must share for its plan to be one plan, in a fixed order:
/// (name, value) pairs. Values are single-line text (a newline in one is written as a space).
using JobFields = std::vector<std::pair<std::string, std::string>>;

/// The job round's record: "protocol=<N>" and "version=<autobatch version>", then one
/// "name=value" line per field.
std::string encodeJobFields(const JobFields& fields, std::string_view version);

/// A rank's job-round record read back: its protocol, its autobatch version and its fields.
struct JobRecord {
  int protocol = 1;
  std::string version;
  JobFields fields;
};
/// Throws: autobatch::Error for text that encodeJobFields did not write (a protocol it knows).
JobRecord decodeJobFields(std::string_view text);

/// Throws: RankError when the ranks' records differ, naming the first field (in rank 0's order)
/// whose value is not rank 0's, with rank 0's value and every other rank's that differs, or when
/// a rank runs another protocol (both autobatch versions named). `by_rank` holds every rank.
void compareJobRecords(const std::vector<JobRecord>& by_rank);

/// What one rank publishes after its search.
struct RankReport {
  int rank = 0;
  /// "ok" after a search; otherwise the rank's failure status ("usage-error", "runtime-error",
  /// "interrupted", ...), with micro-batches 0.
  std::string status = "ok";
  std::string device;
  /// The rank's safe micro-batch (SearchResult::safe_micro_batch); 0 when nothing fits.
  std::int64_t safe_micro_batch = 0;
  /// The micro-batch its plan may use (SearchResult::plan_max_micro_batch, else the safe one).
  std::int64_t plan_max_micro_batch = 0;
  /// SearchResult::plan_verified.
  bool plan_verified = false;
  /// The limit its trials ran under, in bytes.
  std::int64_t memory_limit_bytes = 0;
  /// The inputs its trials used (the flags', else the archive's), as input specs joined by
  /// spaces: compared across the ranks (a rank of another model or other inputs is refused).
  std::string inputs;
  /// kRankProtocol and the autobatch version of the rank that wrote it (RankGroup stamps both).
  int protocol = kRankProtocol;
  std::string version;

  bool operator==(const RankReport&) const = default;
};

/// One line of text, "key=value;..." (what the store holds). decodeRankReport reads it back.
std::string encodeRankReport(const RankReport& report);
/// Throws: autobatch::Error for text that encodeRankReport did not write.
RankReport decodeRankReport(std::string_view text);

/// The ranks' common answer.
struct Agreement {
  /// The minimum over the ranks (0 when any rank has nothing that fits).
  std::int64_t safe_micro_batch = 0;
  std::int64_t plan_max_micro_batch = 0;
  /// Every rank verified its plan bound (a smaller bound than a rank's own stays verified:
  /// memory is monotone below a batch seen to fit).
  bool plan_verified = false;
  /// The ranks whose safe micro-batch is the minimum (the job's bottleneck).
  std::vector<int> limiting_ranks;
  /// Every rank's report, by rank.
  std::vector<RankReport> reports;
};

/// Takes the minimum over `reports` (one per rank, any order).
/// Throws: RankError when a rank runs another protocol (both versions named), when a rank
/// reported a failure status (the message names the ranks and their statuses), or when the ranks'
/// inputs differ (the field, the ranks and both values named); autobatch::Error when a rank is
/// missing, repeated or out of range.
Agreement agree(std::vector<RankReport> reports, int world_size);

}  // namespace autobatch
