// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What one kdnn::cp call's point-to-point exchange moved, and how much of it
// the compute hid: the conv's halo (HaloStats) and the attention's ring.
#include <cstdint>

namespace kdnn::cp {

struct ExchangeStats {
  std::int64_t bytes_sent = 0, bytes_received = 0;
  int messages_sent = 0, messages_received = 0;
  /// Seconds from posting the messages to waiting for them: the compute that
  /// ran while they were in flight.
  double overlapped_seconds = 0;
  /// Seconds then blocked waiting for them (communication not hidden).
  double waited_seconds = 0;

  /// The exchanges of two parts of one call together.
  ExchangeStats& operator+=(const ExchangeStats& o) {
    bytes_sent += o.bytes_sent, bytes_received += o.bytes_received;
    messages_sent += o.messages_sent, messages_received += o.messages_received;
    overlapped_seconds += o.overlapped_seconds, waited_seconds += o.waited_seconds;
    return *this;
  }
};

}  // namespace kdnn::cp
