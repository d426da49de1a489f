#pragma once
// xtensor glue: copy an xtensor expression into a checkpoint Tensor, and see a Tensor (or a
// network's buffer) as an xtensor array without copying.

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <cstddef>
#include <vector>

#include "tensor.hpp"

namespace ckpt {

/// An owning Tensor with the values and shape of `e`.
template <class E>
Tensor to_tensor(const xt::xexpression<E>& e) {
    using T = typename E::value_type;
    const xt::xarray<T, xt::layout_type::row_major> a = e.derived_cast();
    Shape shape(a.shape().begin(), a.shape().end());
    Tensor t = Tensor::uninitialized(dtype_v<T>, std::move(shape));
    std::copy(a.begin(), a.end(), t.values<T>().begin());
    return t;
}

/// A Tensor viewing the memory of a contiguous row-major xtensor container.
template <class C>
    requires requires { C::static_layout; }
Tensor view_of(C& container) {
    using T = typename C::value_type;
    static_assert(C::static_layout == xt::layout_type::row_major, "view_of needs a row-major container");
    Shape shape(container.shape().begin(), container.shape().end());
    return Tensor::view(dtype_v<T>, std::move(shape), container.data());
}

/// The tensor's elements as an xtensor adaptor (no copy); throws TypeMismatch on a wrong T.
template <Element T>
auto as_xarray(Tensor& t) {
    auto values = t.values<T>();
    std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
    return xt::adapt(values.data(), values.size(), xt::no_ownership(), shape);
}
template <Element T>
auto as_xarray(const Tensor& t) {
    auto values = t.values<T>();
    std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
    return xt::adapt(values.data(), values.size(), xt::no_ownership(), shape);
}

}  // namespace ckpt
