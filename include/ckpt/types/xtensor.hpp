#pragma once
// xtensor glue: copy an xtensor expression into a checkpoint Tensor, and see a Tensor (or a
// network's buffer) as an xtensor array without copying.

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <cstddef>
#include <vector>

#include "../tensor.hpp"

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

/// A Tensor viewing the memory of a contiguous row-major or column-major xtensor container,
/// in its order.
template <class C>
    requires requires { C::static_layout; }
Tensor view_of(C& container) {
    using T = typename C::value_type;
    static_assert(C::static_layout == xt::layout_type::row_major || C::static_layout == xt::layout_type::column_major,
                  "view_of needs a container of a row-major or column-major layout fixed at compile time");
    Shape shape(container.shape().begin(), container.shape().end());
    return Tensor::view(dtype_v<T>, std::move(shape), container.data(),
                        C::static_layout == xt::layout_type::column_major ? Order::column_major : Order::row_major);
}

namespace detail {
template <class T>
auto xarray_over(T* data, std::size_t size, const Tensor& t) {
    const Shape logical = t.logical_shape();
    std::vector<std::size_t> shape(logical.begin(), logical.end());
    return xt::adapt<xt::layout_type::dynamic>(
        data, size, xt::no_ownership(), shape,
        t.order() == Order::column_major ? xt::layout_type::column_major : xt::layout_type::row_major);
}
}  // namespace detail

/// The tensor's elements as an xtensor adaptor (no copy) of its logical shape, in its order;
/// throws TypeMismatch on a wrong T.
template <Element T>
auto as_xarray(Tensor& t) {
    auto values = t.values<T>();
    return detail::xarray_over(values.data(), values.size(), t);
}
template <Element T>
auto as_xarray(const Tensor& t) {
    auto values = t.values<T>();
    return detail::xarray_over(values.data(), values.size(), t);
}

}  // namespace ckpt
