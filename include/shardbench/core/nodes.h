// Which node each rank runs on: the one definition of "node" (hybrid sharding's default
// groups, the node count and ranks per node in results and collective_perf's header, host
// memory per rank, the GPU a rank picks). A node is a host name: gathered once from every
// rank of MPI_COMM_WORLD. Not MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): under
// PMIX_MCA_gds=hash it groups ranks of hosts that share one kernel (network namespaces)
// wrongly, e.g. 4 hosts x 2 ranks as groups of 3,3,3,3,3,3,2,2.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace sb {

struct NodeMap {
  std::vector<std::string> hosts;  // node index -> host name, in order of each node's first rank
  std::vector<int> node_of;        // world rank -> node index
  int rank = 0;                    // this process's world rank

  int nodes() const { return int(hosts.size()); }
  int node() const { return node_of[size_t(rank)]; }  // this rank's node
  int ranks_on(int node) const;                      // ranks of MPI_COMM_WORLD on `node`
  int local_ranks() const { return ranks_on(node()); }
  int local_rank() const;           // this rank's index among its node's ranks
  int max_ranks_per_node() const;
  bool uniform() const;             // every node has the same number of ranks
  // Each node's ranks are consecutive world ranks (mpirun's default --map-by slot, srun's
  // block distribution): the layout's inner axes (tensor, then shard) stay inside a node.
  bool node_major() const;
  // The ranks of `ranks` on more than one node: "" when they share one, else e.g.
  // "ranks 0,1 on node1 and node2".
  std::string spans(const std::vector<int>& ranks) const;
  // From a list of host names, one per world rank (what node_map() gathers).
  static NodeMap from_hosts(const std::vector<std::string>& host_of_rank, int rank);
};

// MPI_COMM_WORLD's node map, gathered on the first call (collective then; later calls are
// local). The host name is gethostname()'s.
const NodeMap& node_map();
// A communicator of this rank's node (MPI_Comm_split of MPI_COMM_WORLD by node; collective,
// the caller frees it).
MPI_Comm node_comm();

}  // namespace sb
