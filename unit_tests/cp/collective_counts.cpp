// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MPI's profiling interface: these definitions take the place of the MPI
// library's for this executable; each counts its call and calls PMPI_*.
#include "collective_counts.hpp"

#include <mpi.h>

#include <atomic>

namespace {
std::atomic<long> allgathers{0}, allreduces{0}, bcasts{0};
}  // namespace

extern "C" {
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  ++allgathers;
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  ++allreduces;
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}
int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  ++bcasts;
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}
}

namespace kdnn_test {
CollectiveCounts collective_counts() {
  return {allgathers.load(), allreduces.load(), bcasts.load()};
}
}  // namespace kdnn_test
