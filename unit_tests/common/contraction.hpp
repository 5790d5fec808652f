// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Whether this build's compiler fuses a·b + c into one FMA on the host (GCC
// does by default once the flags allow FMA instructions, e.g.
// -march=native). Then two kernels that sum the same terms in the same order
// can still round differently (one contracted, the other not), and the
// tests that expect bitwise equality of two such host kernels expect it only
// where the build does not contract. kdnn and its tests are compiled with
// the same flags (the tests' -O1 keeps GCC's contraction pass:
// kdnn_TEST_CODE_FLAGS), so the test files' compiler decides as the
// library's does.

namespace kdnn_test {

/// a·a + c with a = 1 + 2⁻³⁰, c = −(1 + 2⁻²⁹): 0 when the product is
/// rounded first (a·a = 1 + 2⁻²⁹ + 2⁻⁶⁰ rounds to 1 + 2⁻²⁹), 2⁻⁶⁰ with an FMA.
inline bool host_contracts() {
  volatile double va = 1.0 + 0x1p-30, vc = -(1.0 + 0x1p-29);  // not folded at compile time
  const double a = va, c = vc;
  return a * a + c != 0.0;
}

}  // namespace kdnn_test
