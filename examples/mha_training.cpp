// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Training one multi-head attention layer with an MSE loss by plain SGD, as
// eigenMHA's demo does, through the cuDNN-shaped descriptor interface: the
// target is what a "teacher" layer with other random weights computes from
// the same inputs, so the loss can fall to (nearly) zero. Prints the loss as
// it falls; exits with status 1 unless it fell below a hundredth of its start.
//
//   mha_training [steps=400] [learning_rate=4]
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "kdnn/kdnn.hpp"

namespace at = kdnn::attention;
using Space = Kokkos::DefaultExecutionSpace;
using T = float;
using Tensor = at::Tensor3<T, Space>;
using Buffer = at::Vector<T, Space>;

/// A View of `count` normal values times `scale`.
static Buffer random_buffer(const std::string& name, std::size_t count, float scale,
                            unsigned seed) {
  Buffer v(name, count);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, scale);
  for (std::size_t i = 0; i < count; ++i) h(i) = normal(gen);
  Kokkos::deep_copy(v, h);
  return v;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  const float lr = argc > 2 ? float(std::atof(argv[2])) : 4.f;
  int status = 0;
  Kokkos::initialize(argc, argv);
  try {
    const int B = 4, S = 16, E = 32, H = 4, D = 8;
    at::AttnDescriptor desc;
    desc.heads = H;
    desc.sm_scaler = 1.0 / std::sqrt(double(D));
    desc.q_size = desc.k_size = desc.v_size = E;
    desc.q_proj_size = desc.k_proj_size = desc.v_proj_size = D;
    desc.o_proj_size = E;
    desc.qo_max_seq_length = desc.kv_max_seq_length = S;
    desc.max_batch_size = B;
    desc.proj_biases = true;
    const at::MhaBufferBytes bytes = at::get_multi_head_attn_buffers<T>(desc);
    const std::size_t n_weights = bytes.weights / sizeof(T);
    const float init = 1.f / std::sqrt(float(E));
    const Buffer w = random_buffer("weights", n_weights, init, 1);
    const Buffer teacher = random_buffer("teacher", n_weights, init, 2);
    const Buffer dw("dweights", n_weights);
    const Buffer workspace("workspace", bytes.workspace / sizeof(T));
    const Buffer reserve("reserve", bytes.reserve / sizeof(T));

    const Buffer x_flat = random_buffer("x", std::size_t(B) * S * E, 1.f, 3);
    const Tensor x(x_flat.data(), B, S, E);  // self-attention: q = k = v = x
    const Tensor target("target", B, S, E), out("out", B, S, E), dout("dout", B, S, E);
    const Tensor dq("dq", B, S, E), dk("dk", B, S, E), dv("dv", B, S, E);
    const at::Vector<const int, Space> none;
    Space space;
    at::multi_head_attn_forward(space, desc, none, none, none, none, x, {}, x, x, target, teacher,
                                workspace, reserve);

    double first = 0, loss = 0;
    for (int step = 0; step <= steps; ++step) {
      at::multi_head_attn_forward(space, desc, none, none, none, none, x, {}, x, x, out, w,
                                  workspace, reserve);
      loss = at::mse_loss(space, out, target);
      if (step == 0) first = loss;
      if (step % 50 == 0 || step == steps) std::printf("step %4d  loss %.6e\n", step, loss);
      if (step == steps) break;
      at::mse_loss_backward(space, out, target, dout);
      at::multi_head_attn_backward_data(space, desc, none, none, none, none, dout, dq, dk, dv, w,
                                        workspace, reserve);
      at::multi_head_attn_backward_weights(space, desc, at::WgradMode::set, x, x, x, w, dw,
                                           reserve);
      Kokkos::parallel_for(
          "sgd", Kokkos::RangePolicy<Space>(space, 0, n_weights),
          KOKKOS_LAMBDA(std::size_t i) { w(i) -= lr * dw(i); });
    }
    std::printf(
        "multi-head attention (B=%d, S=%d, E=%d, H=%d, D=%d), float32, %s: loss %.3e -> %.3e\n", B,
        S, E, H, D, Space::name(), first, loss);
    if (!(loss < first / 100)) {
      std::fprintf(stderr, "mha_training: the loss did not fall below a hundredth of its start\n");
      status = 1;
    }
  } catch (const kdnn::Error& e) {
    std::fprintf(stderr, "mha_training: %s\n", e.what());
    status = 1;
  }
  Kokkos::finalize();
  return status;
}
