// Explicit instantiation of the Sinkhorn operators for the default execution
// space, float and double. Other execution spaces: include
// kdnn/sinkhorn/impl/sinkhorn_impl.hpp and instantiate on use.
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"

namespace kdnn::sinkhorn::impl {

#define KDNN_SINKHORN_ETI(T)                                                          \
  template void forward<Kokkos::DefaultExecutionSpace, T>(                            \
      const Kokkos::DefaultExecutionSpace&, const Batch<const T, Kokkos::DefaultExecutionSpace>&, \
      const Batch<T, Kokkos::DefaultExecutionSpace>&, const ForwardOptions&,          \
      const Report<Kokkos::DefaultExecutionSpace>&);                                  \
  template void backward<Kokkos::DefaultExecutionSpace, T>(                           \
      const Kokkos::DefaultExecutionSpace&, const Batch<const T, Kokkos::DefaultExecutionSpace>&, \
      const Batch<const T, Kokkos::DefaultExecutionSpace>&,                           \
      const Batch<T, Kokkos::DefaultExecutionSpace>&, const BackwardOptions&,         \
      const Report<Kokkos::DefaultExecutionSpace>&);                                  \
  template void backward_unrolled<Kokkos::DefaultExecutionSpace, T>(                  \
      const Kokkos::DefaultExecutionSpace&, const Batch<const T, Kokkos::DefaultExecutionSpace>&, \
      const Batch<const T, Kokkos::DefaultExecutionSpace>&,                           \
      const Batch<T, Kokkos::DefaultExecutionSpace>&, const ForwardOptions&);

KDNN_SINKHORN_ETI(float)
KDNN_SINKHORN_ETI(double)

#undef KDNN_SINKHORN_ETI

}  // namespace kdnn::sinkhorn::impl
