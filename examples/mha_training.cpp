// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Training one multi-head attention layer with an MSE loss by plain SGD, as
// eigenMHA's demo does, through the cuDNN-shaped descriptor interface: the
// target is what a "teacher" layer with other random weights computes from
// the same inputs, so the loss can fall to (nearly) zero.
//
// Before training, the float64 layer's weight gradient is checked against a
// central difference of the loss along a random direction v:
//   ∇L·v ≈ (L(w + h·v) − L(w − h·v)) / 2h,
// an independent reference for the whole backward. Then the float32 layer
// trains; it prints the loss as it falls and the time per step. Exits with
// status 1 unless the gradient agrees and the loss fell below a hundredth of
// its start.
//
//   mha_training [steps=400] [learning_rate=4]
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "kdnn/kdnn.hpp"

namespace at = kdnn::attention;
using Space = Kokkos::DefaultExecutionSpace;

/// A View of `count` normal values times `scale`.
template <class T>
at::Vector<T, Space> random_buffer(const std::string& name, std::size_t count, double scale,
                                   unsigned seed) {
  at::Vector<T, Space> v(name, count);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0., scale);
  for (std::size_t i = 0; i < count; ++i) h(i) = T(normal(gen));
  Kokkos::deep_copy(v, h);
  return v;
}

/// One self-attention layer (q = k = v = x, projection biases) with its
/// weights, buffers and the teacher's target.
template <class T>
struct Layer {
  using Buffer = at::Vector<T, Space>;
  using Tensor = at::Tensor3<T, Space>;
  static constexpr int B = 4, S = 16, E = 32, H = 4, D = 8;

  Space space;
  at::AttnDescriptor desc;
  std::size_t n_weights = 0;
  Buffer w, dw, workspace, reserve, x_flat;
  Tensor x, target, out, dout, dq, dk, dv;
  at::Vector<const int, Space> none;

  Layer() {
    desc.heads = H;
    desc.sm_scaler = 1.0 / std::sqrt(double(D));
    desc.q_size = desc.k_size = desc.v_size = E;
    desc.q_proj_size = desc.k_proj_size = desc.v_proj_size = D;
    desc.o_proj_size = E;
    desc.qo_max_seq_length = desc.kv_max_seq_length = S;
    desc.max_batch_size = B;
    desc.proj_biases = true;
    const at::MhaBufferBytes bytes = at::get_multi_head_attn_buffers<T>(desc);
    n_weights = bytes.weights / sizeof(T);
    const double init = 1.0 / std::sqrt(double(E));
    w = random_buffer<T>("weights", n_weights, init, 1);
    dw = Buffer("dweights", n_weights);
    workspace = Buffer("workspace", bytes.workspace / sizeof(T));
    reserve = Buffer("reserve", bytes.reserve / sizeof(T));
    x_flat = random_buffer<T>("x", std::size_t(B) * S * E, 1.0, 3);
    x = Tensor(x_flat.data(), B, S, E);
    target = Tensor("target", B, S, E);
    out = Tensor("out", B, S, E);
    dout = Tensor("dout", B, S, E);
    dq = Tensor("dq", B, S, E);
    dk = Tensor("dk", B, S, E);
    dv = Tensor("dv", B, S, E);
    const Buffer teacher = random_buffer<T>("teacher", n_weights, init, 2);
    at::multi_head_attn_forward(space, desc, none, none, none, none, x, {}, x, x, target, teacher,
                                workspace, reserve);
  }

  /// The loss of the layer with weights `weights`.
  double loss(const Buffer& weights) {
    at::multi_head_attn_forward(space, desc, none, none, none, none, x, {}, x, x, out, weights,
                                workspace, reserve);
    return at::mse_loss(space, out, target);
  }

  /// The loss with weights w, and its gradient in dw.
  double loss_and_gradient() {
    const double l = loss(w);
    at::mse_loss_backward(space, out, target, dout);
    at::multi_head_attn_backward_data(space, desc, none, none, none, none, dout, dq, dk, dv, w,
                                      workspace, reserve);
    at::multi_head_attn_backward_weights(space, desc, at::WgradMode::set, x, x, x, w, dw, reserve);
    return l;
  }

  /// w + alpha·v into `into`.
  void axpy(const Buffer& into, double alpha, const Buffer& v) const {
    const Buffer weights = w;
    Kokkos::parallel_for(
        "axpy", Kokkos::RangePolicy<Space>(space, 0, n_weights),
        KOKKOS_LAMBDA(std::size_t i) { into(i) = weights(i) + T(alpha) * v(i); });
  }

  double dot(const Buffer& a, const Buffer& b) const {
    double sum = 0;
    Kokkos::parallel_reduce(
        "dot", Kokkos::RangePolicy<Space>(space, 0, n_weights),
        KOKKOS_LAMBDA(std::size_t i, double& s) { s += double(a(i)) * double(b(i)); }, sum);
    return sum;
  }
};

/// The relative difference between ∇L·v and the central difference of the
/// float64 layer's loss along a random unit-variance direction v.
static double gradient_check() {
  Layer<double> layer;
  layer.loss_and_gradient();
  const auto v = random_buffer<double>("direction", layer.n_weights, 1.0, 4);
  const double analytic = layer.dot(layer.dw, v);
  const double h = 1e-5;
  const Layer<double>::Buffer shifted("shifted", layer.n_weights);
  layer.axpy(shifted, h, v);
  const double plus = layer.loss(shifted);
  layer.axpy(shifted, -h, v);
  const double minus = layer.loss(shifted);
  const double numeric = (plus - minus) / (2 * h);
  return std::abs(analytic - numeric) / std::abs(numeric);
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  const float lr = argc > 2 ? float(std::atof(argv[2])) : 4.f;
  int status = 0;
  Kokkos::initialize(argc, argv);
  try {
    using L = Layer<float>;
    std::printf("multi-head attention layer (B=%d, S=%d, E=%d, H=%d, D=%d), %s\n", L::B, L::S, L::E,
                L::H, L::D, Space::name());
    const double gradient_error = gradient_check();
    std::printf("  float64 weight gradient vs central difference: relative error %.2e\n",
                gradient_error);
    if (!(gradient_error < 1e-6)) {
      std::fprintf(stderr, "mha_training: the weight gradient disagrees with the difference\n");
      status = 1;
    }

    L layer;
    const auto w = layer.w;
    const auto dw = layer.dw;
    double first = 0, loss = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step <= steps; ++step) {
      loss = step < steps ? layer.loss_and_gradient() : layer.loss(w);
      if (step == 0) first = loss;
      if (step % 100 == 0) std::printf("  step %4d  loss %.6e\n", step, loss);
      if (step == steps) break;
      Kokkos::parallel_for(
          "sgd", Kokkos::RangePolicy<Space>(layer.space, 0, layer.n_weights),
          KOKKOS_LAMBDA(std::size_t i) { w(i) -= lr * dw(i); });
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  float32 training: loss %.3e -> %.3e in %d steps, %.3f ms per step\n", first,
                loss, steps, 1e3 * seconds / std::max(steps, 1));
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
