#include "shardbench/core/nodes.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "shardbench/core/check.h"

namespace sb {

int NodeMap::ranks_on(int n) const { return int(std::count(node_of.begin(), node_of.end(), n)); }

int NodeMap::local_rank() const { return int(std::count(node_of.begin(), node_of.begin() + rank, node())); }

int NodeMap::max_ranks_per_node() const {
  int most = 0;
  for (int n = 0; n < nodes(); ++n) most = std::max(most, ranks_on(n));
  return most;
}

bool NodeMap::uniform() const {
  for (int n = 0; n < nodes(); ++n)
    if (ranks_on(n) != ranks_on(0)) return false;
  return true;
}

bool NodeMap::node_major() const {
  // Nodes are numbered by first rank, so node-major means the node index never decreases.
  for (size_t r = 1; r < node_of.size(); ++r)
    if (node_of[r] < node_of[r - 1]) return false;
  return true;
}

std::string NodeMap::spans(const std::vector<int>& ranks) const {
  std::vector<int> on;
  for (int r : ranks)
    if (std::find(on.begin(), on.end(), node_of[size_t(r)]) == on.end()) on.push_back(node_of[size_t(r)]);
  if (on.size() <= 1) return "";
  std::string s = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  s += " on ";
  for (size_t i = 0; i < on.size(); ++i) s += (i == 0 ? "" : i + 1 == on.size() ? " and " : ", ") + hosts[size_t(on[i])];
  return s;
}

NodeMap NodeMap::from_hosts(const std::vector<std::string>& host_of_rank, int rank) {
  NodeMap m;
  m.rank = rank;
  std::map<std::string, int> index;
  for (const std::string& h : host_of_rank) {
    const auto it = index.emplace(h, int(m.hosts.size())).first;
    if (it->second == int(m.hosts.size())) m.hosts.push_back(h);
    m.node_of.push_back(it->second);
  }
  return m;
}

const NodeMap& node_map() {
  static const NodeMap map = [] {
    constexpr int kLen = 256;  // HOST_NAME_MAX is 64 on Linux; room for any
    char mine[kLen] = {};
    gethostname(mine, kLen - 1);
    int size = 0, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    std::vector<char> all(size_t(size) * kLen);
    MPI_CHECK(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD));
    std::vector<std::string> hosts;
    for (int r = 0; r < size; ++r) hosts.emplace_back(&all[size_t(r) * kLen], strnlen(&all[size_t(r) * kLen], kLen));
    return NodeMap::from_hosts(hosts, rank);
  }();
  return map;
}

MPI_Comm node_comm() {
  const NodeMap& m = node_map();
  MPI_Comm c;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, m.node(), m.rank, &c));
  return c;
}

}  // namespace sb
