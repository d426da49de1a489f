#pragma once
// Basic types of the training stack: arrays, parameters, errors, and the BLAS calls that do
// the GEMM-shaped work (Debian's OpenBLAS through cblas).

#include <cblas.h>
#include <xtensor/xarray.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../ckpt/error.hpp"
#include "../ckpt/param_dict.hpp"
#include "../ckpt/types/xtensor.hpp"

// OpenBLAS' own entry points; declared here because the reference cblas.h lacks them.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace nn {

/// Activations, gradients and parameters: contiguous row-major float arrays.
using Array = xt::xarray<float, xt::layout_type::row_major>;

/// Bad training data: a missing or malformed file, an out-of-range label.
class DataError : public ckpt::Error {
public:
    using ckpt::Error::Error;
};
/// An input whose shape is not what a layer or model expects.
class ShapeError : public ckpt::Error {
public:
    using ckpt::Error::Error;
};

/// A trainable tensor and its gradient, known by the name it has in checkpoints.
struct Parameter {
    std::string name;
    Array value;
    Array grad;
};

/// "(a, b, c)" for messages.
template <class Shape>
std::string shape_string(const Shape& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + ")";
}

/// Views of the parameters' values, by name: what a checkpoint stores and loads in place.
inline ckpt::ParamDict parameter_views(const std::vector<Parameter*>& params) {
    ckpt::ParamDict d;
    for (Parameter* p : params) d.set(p->name, ckpt::view_of(p->value));
    return d;
}

/// Sets the number of threads BLAS uses. Results are bit-identical between runs for a fixed
/// thread count; the examples and benchmarks default to one.
inline void set_blas_threads(int n) { openblas_set_num_threads(n); }
inline int blas_threads() { return openblas_get_num_threads(); }

namespace blas {

/// C(m×n) = alpha · op(A) · op(B) + beta · C, all row-major and contiguous.
inline void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                 const float* b, float beta, float* c) {
    const auto lda = static_cast<int>(trans_a ? m : k);
    const auto ldb = static_cast<int>(trans_b ? k : n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, lda, b, ldb, beta, c,
                static_cast<int>(n));
}

}  // namespace blas
}  // namespace nn
