// ParamDict, Value and Tensor: construction, typed access and the errors it gives.
#include <ckpt/types/xtensor.hpp>

#include <doctest/doctest.h>

#include "support.hpp"

TEST_SUITE("values") {

TEST_CASE("ParamDict keeps insertion order and replaces in place") {
    ckpt::ParamDict d{{"b", 1}, {"a", 2.5}, {"c", "three"}};
    d.set("a", true);
    std::vector<std::string> names;
    for (const auto& e : d) names.push_back(e.name);
    CHECK(names == std::vector<std::string>{"b", "a", "c"});
    CHECK(d.get<bool>("a"));
    CHECK(d.erase("b"));
    CHECK_FALSE(d.contains("b"));
    CHECK(d.get<std::string>("c") == "three");
    CHECK(d.size() == 2);
}

TEST_CASE("typed access names the key and both types on a mismatch") {
    ckpt::ParamDict d{{"lr", 0.01}, {"epoch_num", 7}};
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2}));
    CHECK(d.get<double>("lr") == 0.01);
    CHECK(d.get<int>("epoch_num") == 7);
    CHECK(d.get<std::int64_t>("epoch_num") == 7);
    CHECK_THROWS_WITH_AS(d.get<std::int64_t>("lr"), "checkpoint value 'lr' is double, expected integer",
                         ckpt::TypeMismatch);
    CHECK_THROWS_WITH_AS(d.get<double>("w"), "checkpoint value 'w' is float32[2], expected double", ckpt::TypeMismatch);
    CHECK_THROWS_WITH_AS(d.tensor("lr"), "checkpoint value 'lr' is double, expected tensor", ckpt::TypeMismatch);
    CHECK_THROWS_WITH_AS(d.get<int>("missing"), "no entry named 'missing' in the checkpoint values", ckpt::NotFound);
    d.set("big", std::int64_t{1} << 40);
    CHECK_THROWS_AS(d.get<int>("big"), ckpt::TypeMismatch);
}

TEST_CASE("tensor values are checked against the dtype") {
    auto t = ckpt::Tensor::from(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(t.numel() == 6);
    CHECK(t.nbytes() == 24);
    CHECK(t.describe() == "int32[2, 3]");
    CHECK(t.values<std::int32_t>()[5] == 6);
    CHECK_THROWS_WITH_AS(t.values<float>(), "tensor int32[2, 3] read as float32", ckpt::TypeMismatch);
    CHECK_THROWS_AS(ckpt::Tensor::from(std::vector<float>{1, 2, 3}, {2, 2}), ckpt::TypeMismatch);
}

TEST_CASE("a view borrows memory and a clone owns a copy") {
    std::vector<float> buffer{1, 2, 3};
    auto v = ckpt::Tensor::view(std::span<float>(buffer), {3});
    CHECK(v.is_view());
    v.values<float>()[0] = 9;
    CHECK(buffer[0] == 9);
    auto c = v.clone();
    CHECK_FALSE(c.is_view());
    c.values<float>()[1] = -1;
    CHECK(buffer[1] == 2);
    CHECK(c != v);
}

TEST_CASE("float16 converts exactly where binary16 can") {
    for (float f : {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f})
        CHECK(static_cast<float>(ckpt::float16(f)) == f);
    CHECK(ckpt::float16(1.0f + 1.0f / 2048).bits == ckpt::float16(1.0f).bits);  // ties to even
    CHECK(ckpt::float16(1e6f).bits == 0x7c00);                                // overflow to inf
}

TEST_CASE("xtensor expressions convert to and from tensors") {
    xt::xarray<double> a = {{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}};
    auto t = ckpt::to_tensor(a);
    CHECK(t.describe() == "float64[2, 3]");
    auto view = ckpt::as_xarray<double>(t);
    CHECK(view(1, 2) == 6.0);
    view(0, 0) = -1.0;
    CHECK(t.values<double>()[0] == -1.0);
    xt::xtensor<float, 2> grid = xt::zeros<float>({2, 2});
    auto v = ckpt::view_of(grid);
    v.values<float>()[3] = 5.0f;
    CHECK(grid(1, 1) == 5.0f);
    // a column-major container keeps its order, and a column-major tensor reads as its values
    xt::xtensor<float, 2, xt::layout_type::column_major> fortran = {{1.0f, 2.0f, 3.0f}, {4.0f, 5.0f, 6.0f}};
    auto f = ckpt::view_of(fortran);
    CHECK(f.describe() == "float32[2, 3] column-major");
    CHECK(f.values<float>()[1] == 4.0f);  // memory order: the first index fastest
    CHECK(ckpt::as_xarray<float>(f)(0, 1) == 2.0f);
    CHECK(ckpt::as_xarray<float>(f.in_order(ckpt::Order::row_major))(0, 1) == 2.0f);
}

TEST_CASE("a tensor's storage order: its logical shape, its bytes, equality and copies") {
    // the matrix [[0, 1, 2], [3, 4, 5]], column-major in memory
    const std::vector<std::int32_t> columns{0, 3, 1, 4, 2, 5};
    const auto m = ckpt::Tensor::from(columns, {2, 3}, ckpt::Order::column_major);
    CHECK(m.order() == ckpt::Order::column_major);
    CHECK(m.logical_shape() == ckpt::Shape{2, 3});
    CHECK(m.shape() == ckpt::Shape{3, 2});  // the bytes read row-major: the transpose
    CHECK(m.describe() == "int32[2, 3] column-major");
    const ckpt::Tensor rows = m.in_order(ckpt::Order::row_major);
    CHECK(rows.describe() == "int32[2, 3]");
    CHECK(std::vector<std::int32_t>(rows.values<std::int32_t>().begin(), rows.values<std::int32_t>().end()) ==
          std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
    CHECK(rows.in_order(ckpt::Order::column_major) == m);
    CHECK(m.in_order(ckpt::Order::column_major).data() == m.data());  // already so: shared, not copied
    // the same bytes in the other order are another matrix (its transpose), not equal
    CHECK_FALSE(ckpt::Tensor::from(columns, {3, 2}) == m);
    const ckpt::Tensor copy = m.clone();
    CHECK(copy == m);
    CHECK(copy.data() != m.data());
    // rank 0 and 1 have no order
    CHECK(ckpt::Tensor(ckpt::DType::float32, {4}, ckpt::Order::column_major).order() == ckpt::Order::row_major);
    CHECK(ckpt::Tensor(ckpt::DType::float32, {}, ckpt::Order::column_major).order() == ckpt::Order::row_major);
    // rank 3: element (i, j, k) of a [2, 3, 4] tensor
    std::vector<float> fortran(24);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) fortran[static_cast<std::size_t>(i + 2 * j + 6 * k)] = 100.0f * i + 10.0f * j + k;
    const auto cube = ckpt::Tensor::from(fortran, {2, 3, 4}, ckpt::Order::column_major).in_order(ckpt::Order::row_major);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k)
                CHECK(cube.values<float>()[static_cast<std::size_t>(12 * i + 4 * j + k)] == 100.0f * i + 10.0f * j + k);
    // a view checks its element count against the logical shape
    CHECK_THROWS_WITH_AS(ckpt::Tensor::view(std::span<float>(fortran), {5, 5}, ckpt::Order::column_major),
                         "shape [5, 5] needs 25 elements, got 24", ckpt::TypeMismatch);
}

TEST_CASE("append_info follows the seed's list form") {
    ckpt::AppendInfo info{"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}, {"momentum", 0.9}}};
    ckpt::ParamDict d;
    ckpt::Progress p;
    p.epoch = 6;
    p.global_step = 11250;
    info.apply(d, p);
    CHECK(d.get<std::int64_t>("epoch_num") == 6);
    CHECK(d.get<std::int64_t>("step_num") == 11250);
    CHECK(d.get<double>("momentum") == 0.9);
    CHECK_THROWS_AS((ckpt::AppendInfo{"epoch", "step_num"}), ckpt::ConfigError);
}
}
