#include "autobatch/run/ranks.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"

namespace autobatch {
namespace {

// An integer from a flag or an environment variable, named in the error.
struct Field {
  std::optional<std::int64_t> value;
  std::string origin;  // "--rank", "RANK", ...
};

Field pick(std::optional<int> flag, std::string_view flag_name, const EnvLookup& env,
           const std::vector<std::string_view>& names, std::int64_t min, std::int64_t max) {
  if (flag) {
    if (*flag < min || *flag > max) {
      throw Error(std::string(flag_name) + ": expected a value in [" + std::to_string(min) + ", " +
                  std::to_string(max) + "], but got " + std::to_string(*flag));
    }
    return {*flag, std::string(flag_name)};
  }
  for (auto name : names) {
    if (auto text = env(name); text && !text->empty()) {
      return {parseInteger(*text, "environment variable " + std::string(name), min, max),
              std::string(name)};
    }
  }
  return {};
}

// Set and not empty: launch scripts often export a variable empty rather than unset it.
bool given(const EnvLookup& env, std::string_view name) {
  const auto value = env(name);
  return value && !value->empty();
}

bool isHostNameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
}

// The store's host as given (`origin` names where it came from): an IPv4 or IPv6 literal that
// inet_pton reads, or a host name of letters, digits, '-', '_' and '.'. "256.1.1.1" is no host
// name (only digits and dots): it is an IPv4 address with an octet out of range, which the store
// reported as a port in use (issue 27, row 21).
void checkHost(const std::string& host, std::string_view origin) {
  const std::string where = std::string(origin) + ": expected ";
  if (host.empty()) throw Error(where + "a host name or address, but got ''");
  if (host.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr v4{};
    if (inet_pton(AF_INET, host.c_str(), &v4) != 1) {
      throw Error(where +
                  "an IPv4 address of four numbers in [0, 255] (e.g. 10.0.0.1) or a host name, "
                  "but got '" +
                  host + "'");
    }
    return;
  }
  if (host.find(':') != std::string::npos) {
    in6_addr v6{};
    if (inet_pton(AF_INET6, host.substr(0, host.find('%')).c_str(), &v6) != 1) {
      throw Error(where + "an IPv6 address such as fd00::1 (without brackets), but got '" + host +
                  "'");
    }
    return;
  }
  const bool name_ok = host.size() <= 253 && host.front() != '-' && host.front() != '.' &&
                       std::all_of(host.begin(), host.end(), isHostNameCharacter);
  if (!name_ok) {
    throw Error(where +
                "a host name (letters, digits, '-', '_' and '.', at most 253 characters) or an "
                "address, but got '" +
                host + "'");
  }
}

std::string join(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Report values that may hold the separators (an input spec, a device, a version): '%' and ';'
// written as %25 and %3B.
std::string escapeValue(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '%') {
      out += "%25";
    } else if (c == ';') {
      out += "%3B";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string unescapeValue(std::string_view value) {
  std::string out;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value.substr(i, 3) == "%25") {
      out += '%';
      i += 2;
    } else if (value.substr(i, 3) == "%3B") {
      out += ';';
      i += 2;
    } else {
      out += value[i];
    }
  }
  return out;
}

std::string oneLine(std::string value) {
  std::replace(value.begin(), value.end(), '\n', ' ');
  return value;
}

// A rank of another protocol: both versions named (the other's may be unknown: version 1 wrote
// none).
std::string versionsDiffer(int rank, int protocol, const std::string& version,
                           const std::string& ours) {
  return "ranks disagree on the autobatch version: rank " + std::to_string(rank) + " runs " +
         (version.empty() ? std::string("an autobatch without a version in its records")
                          : "autobatch " + version) +
         " (rank records of protocol " + std::to_string(protocol) + "), this job's other ranks " +
         (ours.empty() ? std::string("another") : "autobatch " + ours) + " (protocol " +
         std::to_string(kRankProtocol) + "); run the same autobatch on every rank";
}
}  // namespace

EnvLookup processEnvironment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::string firstSlurmHost(std::string_view nodelist) {
  const auto open = nodelist.find('[');
  const auto comma = nodelist.find(',');
  if (nodelist.empty() || comma == 0) {
    throw Error("SLURM_JOB_NODELIST: expected a node list like node[01-04], but got '" +
                std::string(nodelist) + "'");
  }
  if (open == std::string_view::npos || (comma != std::string_view::npos && comma < open)) {
    return std::string(nodelist.substr(0, comma));
  }
  const auto close = nodelist.find(']', open);
  const auto end = nodelist.find_first_of(",-]", open + 1);
  if (close == std::string_view::npos || end == open + 1) {
    throw Error("SLURM_JOB_NODELIST: expected balanced brackets like node[01-04], but got '" +
                std::string(nodelist) + "'");
  }
  return std::string(nodelist.substr(0, open)) +
         std::string(nodelist.substr(open + 1, end - open - 1));
}

RankInfo resolveRankInfo(const RankFlags& flags, const EnvLookup& env) {
  RankInfo info;
  // The launcher is torchrun when either of its two variables is set, else Slurm when either of
  // its two is. Each variable counts alone (WORLD_SIZE=3 alone plans for 3 ranks, as
  // --world-size 3 alone), and a malformed one is an error whichever others are set: before
  // issue 27 a variable was read only with its partner, so WORLD_SIZE alone was ignored.
  const bool torchrun = given(env, "RANK") || given(env, "WORLD_SIZE");
  const bool slurm = !torchrun && (given(env, "SLURM_PROCID") || given(env, "SLURM_NTASKS"));
  using Names = std::vector<std::string_view>;
  auto names = [&](std::string_view of_torchrun, std::string_view of_slurm) {
    return torchrun ? Names{of_torchrun} : slurm ? Names{of_slurm} : Names{};
  };
  constexpr std::int64_t kMaxRanks = 1 << 20;
  const Field world = pick(flags.world_size, "--world-size", env,
                           names("WORLD_SIZE", "SLURM_NTASKS"), 1, kMaxRanks);
  const Field rank = pick(flags.rank, "--rank", env, names("RANK", "SLURM_PROCID"), 0, kMaxRanks);
  // The GPU index alone (LOCAL_RANK=1, no launcher) still picks the GPU.
  const Field local = pick(flags.local_rank, "--local-rank", env,
                           torchrun || slurm ? names("LOCAL_RANK", "SLURM_LOCALID")
                                             : Names{"LOCAL_RANK", "SLURM_LOCALID"},
                           0, kMaxRanks);
  info.world_size = static_cast<int>(world.value.value_or(1));
  info.rank = static_cast<int>(rank.value.value_or(0));
  info.local_rank = static_cast<int>(local.value.value_or(0));
  if (rank.value) {
    info.source = flags.rank ? "flags" : (torchrun ? "torchrun" : "slurm");
  }
  if (info.rank >= info.world_size) {
    throw Error("rank: expected a rank in [0, " + std::to_string(info.world_size) +
                ") for world size " + std::to_string(info.world_size) + " (" +
                (world.value ? world.origin
                             : std::string("default: give --world-size or ") +
                                   (slurm ? "SLURM_NTASKS" : "WORLD_SIZE")) +
                "), but got " + std::to_string(info.rank) + " (" + rank.origin + ")");
  }

  if (flags.master_addr) {
    info.master_addr = *flags.master_addr;
    info.master_addr_origin = "--master-addr";
  } else if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    info.master_addr = *addr;
    info.master_addr_origin = "MASTER_ADDR";
  } else if (auto nodes = env("SLURM_JOB_NODELIST"); slurm && nodes) {
    info.master_addr = firstSlurmHost(*nodes);
    info.master_addr_origin = "SLURM_JOB_NODELIST";
  }
  checkHost(info.master_addr, info.master_addr_origin);
  const Field port = pick(flags.master_port, "--master-port", env, {"MASTER_PORT"}, 1, 65535);
  if (port.value) {
    info.master_port = static_cast<int>(*port.value);
  } else if (auto job = env("SLURM_JOB_ID"); slurm && job && !job->empty()) {
    const auto id = parseInteger(*job, "environment variable SLURM_JOB_ID", 0,
                                 std::numeric_limits<std::int64_t>::max());
    info.master_port = kSlurmPortBase + static_cast<int>(id % 10000);
  }
  info.use_agent_store = torchrun && !flags.master_addr && !flags.master_port &&
                         env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  return info;
}

std::string rankDevice(std::string_view device, int local_rank) {
  if (device == "cuda") return "cuda:" + std::to_string(local_rank);
  return std::string(device);
}

std::string encodeRankReport(const RankReport& r) {
  std::ostringstream out;
  out << "protocol=" << r.protocol << ";version=" << escapeValue(r.version) << ";rank=" << r.rank
      << ";status=" << r.status << ";device=" << escapeValue(r.device)
      << ";safe=" << r.safe_micro_batch << ";plan_max=" << r.plan_max_micro_batch
      << ";verified=" << (r.plan_verified ? 1 : 0) << ";limit=" << r.memory_limit_bytes
      << ";inputs=" << escapeValue(r.inputs);
  return out.str();
}

RankReport decodeRankReport(std::string_view text) {
  RankReport r;
  // Another protocol's report is not read field by field: its rank and version are enough for
  // agree() to refuse it naming both versions (a parse error named neither).
  // Version 1 wrote no protocol: its 7 keys exactly (rank, status, device, safe, plan_max,
  // verified, limit) are such a report; anything else without a protocol is no report.
  r.protocol = 0;
  int v1_keys = 0;
  int items = 0;
  for (std::string_view rest = text; !rest.empty(); ++items) {
    const auto end = std::min(rest.find(';'), rest.size());
    const std::string_view item = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    if (item.starts_with("protocol=")) {
      r.protocol =
          static_cast<int>(parseInteger(item.substr(9), "rank report: protocol", 1, 1 << 20));
    } else if (item.starts_with("version=")) {
      r.version = unescapeValue(item.substr(8));
    } else if (item.starts_with("rank=")) {
      r.rank = static_cast<int>(parseInteger(item.substr(5), "rank report: rank", 0, 1 << 20));
    }
    for (const std::string_view k :
         {"rank=", "status=", "device=", "safe=", "plan_max=", "verified=", "limit="}) {
      if (item.starts_with(k)) ++v1_keys;
    }
  }
  if (r.protocol == 0) {
    if (v1_keys != 7 || items != 7) {
      throw Error("rank report: expected 'protocol=N;...' as autobatch writes it, but got '" +
                  std::string(text.substr(0, 200)) + "'");
    }
    r.protocol = 1;
  }
  if (r.protocol != kRankProtocol) return r;
  int seen = 0;
  while (!text.empty()) {
    const auto end = std::min(text.find(';'), text.size());
    const std::string_view item = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw Error("rank report: expected key=value, but got '" + std::string(item) + "'");
    }
    const auto key = item.substr(0, eq);
    const auto value = item.substr(eq + 1);
    constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
    if (key == "rank") {
      r.rank = static_cast<int>(parseInteger(value, "rank report: rank", 0, 1 << 20));
    } else if (key == "status") {
      r.status = value;
    } else if (key == "device") {
      r.device = unescapeValue(value);
    } else if (key == "safe") {
      r.safe_micro_batch = parseInteger(value, "rank report: safe", 0, kMax);
    } else if (key == "plan_max") {
      r.plan_max_micro_batch = parseInteger(value, "rank report: plan_max", 0, kMax);
    } else if (key == "verified") {
      r.plan_verified = parseInteger(value, "rank report: verified", 0, 1) == 1;
    } else if (key == "limit") {
      r.memory_limit_bytes = parseInteger(value, "rank report: limit", 0, kMax);
    } else if (key == "inputs") {
      r.inputs = unescapeValue(value);
    } else if (key != "protocol" && key != "version") {
      throw Error("rank report: unexpected key '" + std::string(key) + "'");
    }
    ++seen;
  }
  if (seen != 10) {
    throw Error("rank report: expected 10 fields, but got " + std::to_string(seen));
  }
  return r;
}

std::string encodeJobFields(const JobFields& fields, std::string_view version) {
  std::string out = "protocol=" + std::to_string(kRankProtocol) +
                    "\nversion=" + oneLine(std::string(version)) + "\n";
  for (const auto& [name, value] : fields) out += name + "=" + oneLine(value) + "\n";
  return out;
}

JobRecord decodeJobFields(std::string_view text) {
  JobRecord record;
  while (!text.empty()) {
    const auto end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const auto eq = line.find('=');
    if (eq == std::string_view::npos) {
      throw Error("job record: expected name=value lines, but got '" + std::string(line) + "'");
    }
    const std::string name(line.substr(0, eq));
    const std::string value(line.substr(eq + 1));
    if (name == "protocol") {
      record.protocol = static_cast<int>(parseInteger(value, "job record: protocol", 1, 1 << 20));
    } else if (name == "version") {
      record.version = value;
    } else {
      record.fields.emplace_back(name, value);
    }
  }
  return record;
}

void compareJobRecords(const std::vector<JobRecord>& by_rank) {
  if (by_rank.empty()) return;
  const JobRecord& first = by_rank.front();
  for (std::size_t r = 0; r < by_rank.size(); ++r) {
    if (by_rank[r].protocol != kRankProtocol) {
      throw RankError(versionsDiffer(static_cast<int>(r), by_rank[r].protocol, by_rank[r].version,
                                     first.version));
    }
    if (by_rank[r].version != first.version) {
      throw RankError("ranks disagree on the autobatch version: rank 0 runs autobatch " +
                      first.version + ", rank " + std::to_string(r) + " runs autobatch " +
                      by_rank[r].version + "; run the same autobatch on every rank");
    }
  }
  for (const auto& [name, value] : first.fields) {
    std::string others;
    for (std::size_t r = 1; r < by_rank.size(); ++r) {
      const auto& fields = by_rank[r].fields;
      // (no structured binding captured: clang 14 refuses it in a lambda)
      const std::string& wanted = name;
      const auto it = std::find_if(fields.begin(), fields.end(),
                                   [&wanted](const auto& f) { return f.first == wanted; });
      const std::string theirs = it == fields.end() ? "(none)" : it->second;
      if (theirs != value) {
        others +=
            (others.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " has '" + theirs + "'");
      }
    }
    if (!others.empty()) {
      throw RankError("ranks disagree on " + name + ": rank 0 has '" + value + "', " + others +
                      "; every rank of one job must run it with the same " + name +
                      " (the plan would differ between ranks and their collectives mismatch)");
    }
  }
}

Agreement agree(std::vector<RankReport> reports, int world_size) {
  std::sort(reports.begin(), reports.end(),
            [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  for (const auto& r : reports) {
    if (r.protocol != kRankProtocol) {
      const auto ours = std::find_if(reports.begin(), reports.end(), [](const RankReport& o) {
        return o.protocol == kRankProtocol;
      });
      throw RankError(versionsDiffer(r.rank, r.protocol, r.version,
                                     ours == reports.end() ? "" : ours->version));
    }
  }
  if (static_cast<int>(reports.size()) != world_size) {
    throw Error("rank reports: expected " + std::to_string(world_size) + ", but got " +
                std::to_string(reports.size()));
  }
  std::vector<int> failed;
  std::string statuses;
  for (int i = 0; i < world_size; ++i) {
    const auto& r = reports[static_cast<std::size_t>(i)];
    if (r.rank != i) {
      throw Error("rank reports: expected one report per rank 0.." +
                  std::to_string(world_size - 1) + ", but rank " + std::to_string(i) +
                  " is missing or repeated");
    }
    if (r.status != "ok") {
      failed.push_back(r.rank);
      statuses +=
          (statuses.empty() ? "" : ", ") + ("rank " + std::to_string(r.rank) + ": " + r.status);
    }
  }
  if (!failed.empty()) {
    throw RankError("ranks could not agree: rank(s) " + join(failed) + " failed before agreeing (" +
                    statuses + "); see their logs");
  }
  for (const auto& r : reports) {
    if (r.inputs != reports.front().inputs) {
      throw RankError("ranks disagree on inputs: rank 0 has '" + reports.front().inputs +
                      "', rank " + std::to_string(r.rank) + " has '" + r.inputs +
                      "'; every rank of one job must train the same model on the same inputs");
    }
  }
  Agreement a;
  a.safe_micro_batch = reports.front().safe_micro_batch;
  a.plan_max_micro_batch = reports.front().plan_max_micro_batch;
  a.plan_verified = true;
  for (const auto& r : reports) {
    a.safe_micro_batch = std::min(a.safe_micro_batch, r.safe_micro_batch);
    a.plan_max_micro_batch = std::min(a.plan_max_micro_batch, r.plan_max_micro_batch);
    a.plan_verified = a.plan_verified && r.plan_verified;
  }
  for (const auto& r : reports) {
    if (r.safe_micro_batch == a.safe_micro_batch) a.limiting_ranks.push_back(r.rank);
  }
  a.reports = std::move(reports);
  return a;
}

}  // namespace autobatch
