// Eigen's dense objects as checkpoint tensors (ckpt/types/eigen.hpp): views in each object's own
// order, round trips bit-exact through every archive kind and a codec, loads across orders,
// resizing on load, the refusals, and the same matrix in NumPy and in an npz.
#include <ckpt/types/eigen.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "python_scripts.hpp"
#include "support.hpp"

namespace eigen_test {

using Eigen::Dynamic;
using Eigen::RowMajor;

/// Random bits in every element (NaN payloads, infinities and -0.0 as they come), but 0 or 1 for bool.
template <class Scalar>
void fill_bits(Scalar* data, Eigen::Index n, unsigned seed) {
    std::mt19937_64 rng(seed);
    auto* bytes = reinterpret_cast<unsigned char*>(data);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * sizeof(Scalar); ++i)
        bytes[i] = static_cast<unsigned char>(std::is_same_v<Scalar, bool> ? rng() & 1 : rng());
}
template <class X>
void fill(X& x, unsigned seed) {
    fill_bits(x.data(), x.size(), seed);
}

template <class X>
bool same_bits(const X& a, const X& b) {
    using Scalar = std::remove_cv_t<std::remove_reference_t<decltype(*a.data())>>;
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(Scalar)) == 0;
}
template <class X, class Y>
bool same_shape(const X& a, const Y& b) {
    return a.rows() == b.rows() && a.cols() == b.cols();
}

/// One of every kind view_of takes.
struct Objects {
    Eigen::MatrixXd dynamic_col{5, 7};
    Eigen::Matrix<float, Dynamic, Dynamic, RowMajor> dynamic_row{4, 3};
    Eigen::Matrix3d fixed_square;
    Eigen::Matrix<std::int32_t, 2, 4, RowMajor> fixed_row;
    Eigen::VectorXd vector{6};
    Eigen::RowVectorXf row_vector{5};
    Eigen::Array<std::int64_t, Dynamic, 1> array_vector{3};
    Eigen::ArrayXXf array{3, 2};
    Eigen::Array<bool, 2, 3> mask;
    Eigen::Array<std::uint8_t, Dynamic, Dynamic, RowMajor> bytes{2, 5};
    Eigen::Tensor<double, 3> tensor{2, 3, 4};
    Eigen::Tensor<float, 3, RowMajor> tensor_row{3, 2, 2};
    std::vector<double> mapped_memory = std::vector<double>(20);
    Eigen::Map<Eigen::MatrixXd> map{mapped_memory.data(), 4, 5};
    std::vector<float> tensor_memory = std::vector<float>(12);
    Eigen::TensorMap<Eigen::Tensor<float, 2, RowMajor>> tensor_map{tensor_memory.data(), 3, 4};

    explicit Objects(unsigned seed) {
        fill(dynamic_col, seed + 1), fill(dynamic_row, seed + 2), fill(fixed_square, seed + 3), fill(fixed_row, seed + 4);
        fill(vector, seed + 5), fill(row_vector, seed + 6), fill(array_vector, seed + 7), fill(array, seed + 8);
        fill(mask, seed + 9), fill(bytes, seed + 10), fill(tensor, seed + 11), fill(tensor_row, seed + 12);
        fill(map, seed + 13), fill(tensor_map, seed + 14);
    }

    ckpt::ParamDict views() {
        return {{"dynamic_col", ckpt::view_of(dynamic_col)}, {"dynamic_row", ckpt::view_of(dynamic_row)},
                {"fixed_square", ckpt::view_of(fixed_square)}, {"fixed_row", ckpt::view_of(fixed_row)},
                {"vector", ckpt::view_of(vector)}, {"row_vector", ckpt::view_of(row_vector)},
                {"array_vector", ckpt::view_of(array_vector)}, {"array", ckpt::view_of(array)},
                {"mask", ckpt::view_of(mask)}, {"bytes", ckpt::view_of(bytes)}, {"tensor", ckpt::view_of(tensor)},
                {"tensor_row", ckpt::view_of(tensor_row)}, {"map", ckpt::view_of(map)},
                {"tensor_map", ckpt::view_of(tensor_map)}};
    }

    void check_same_as(const Objects& o) const {
        CHECK(same_bits(dynamic_col, o.dynamic_col));
        CHECK(same_bits(dynamic_row, o.dynamic_row));
        CHECK(same_bits(fixed_square, o.fixed_square));
        CHECK(same_bits(fixed_row, o.fixed_row));
        CHECK(same_bits(vector, o.vector));
        CHECK(same_bits(row_vector, o.row_vector));
        CHECK(same_bits(array_vector, o.array_vector));
        CHECK(same_bits(array, o.array));
        CHECK(same_bits(mask, o.mask));
        CHECK(same_bits(bytes, o.bytes));
        CHECK(same_bits(tensor, o.tensor));
        CHECK(same_bits(tensor_row, o.tensor_row));
        CHECK(same_bits(map, o.map));
        CHECK(same_bits(tensor_map, o.tensor_map));
    }
};

/// m(i, j) = 10 i + j of `Matrix`'s type and size.
template <class Matrix>
Matrix numbered(Eigen::Index rows, Eigen::Index cols) {
    Matrix m(rows, cols);
    for (Eigen::Index i = 0; i < rows; ++i)
        for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = static_cast<typename Matrix::Scalar>(10 * i + j);
    return m;
}

struct Way {
    const char* name;
    ckpt::SaveOptions save;
};
const Way ways[] = {{"binary", {}},
                    {"text", {.archive = ckpt::ArchiveKind::text}},
                    {"xml", {.archive = ckpt::ArchiveKind::xml}},
                    {"binary+zstd", {.codecs = ckpt::Zstd{3}.codecs()}},
                    {"xml+zstd", {.archive = ckpt::ArchiveKind::xml, .codecs = ckpt::Zstd{1}.codecs()}}};

}  // namespace eigen_test

TEST_SUITE("eigen") {

using namespace eigen_test;  // here, not at file scope: the unit suites are compiled together

TEST_CASE("views of Eigen objects have their shapes and orders, and copy nothing") {
    Objects o(1);
    const ckpt::ParamDict v = o.views();
    auto described = [&](const char* name) { return v.tensor(name).describe(); };
    CHECK(described("dynamic_col") == "float64[5, 7] column-major");
    CHECK(described("dynamic_row") == "float32[4, 3]");
    CHECK(described("fixed_square") == "float64[3, 3] column-major");
    CHECK(described("fixed_row") == "int32[2, 4]");
    CHECK(described("vector") == "float64[6]");
    CHECK(described("row_vector") == "float32[5]");
    CHECK(described("array_vector") == "int64[3]");
    CHECK(described("array") == "float32[3, 2] column-major");
    CHECK(described("mask") == "bool[2, 3] column-major");
    CHECK(described("bytes") == "uint8[2, 5]");
    CHECK(described("tensor") == "float64[2, 3, 4] column-major");
    CHECK(described("tensor_row") == "float32[3, 2, 2]");
    CHECK(described("map") == "float64[4, 5] column-major");
    CHECK(described("tensor_map") == "float32[3, 4]");
    CHECK(v.tensor("dynamic_col").data() == reinterpret_cast<std::byte*>(o.dynamic_col.data()));
    CHECK(v.tensor("map").data() == reinterpret_cast<std::byte*>(o.mapped_memory.data()));
    CHECK(v.tensor("tensor").data() == reinterpret_cast<std::byte*>(o.tensor.data()));
    CHECK(v.tensor("dynamic_col").is_view());
    // element (i, j) of the view's logical shape is m(i, j): the bytes are the matrix's own
    const ckpt::Tensor row_major = v.tensor("dynamic_col").in_order(ckpt::Order::row_major);
    const auto rows = row_major.values<double>();
    CHECK(std::memcmp(&rows[7 * 2 + 3], &o.dynamic_col(2, 3), sizeof(double)) == 0);
    // rank 0
    Eigen::Tensor<double, 0> scalar;
    scalar() = 2.5;
    CHECK(ckpt::view_of(scalar).describe() == "float64[]");
    CHECK(ckpt::view_of(scalar).values<double>()[0] == 2.5);
}

TEST_CASE("every kind round-trips bit-exact through every archive kind and a codec, in place") {
    test::TempDir dir;
    Objects saved(10);
    for (const Way& way : ways) {
        CAPTURE(way.name);
        ckpt::save_checkpoint(saved.views(), dir / "e.ckpt", way.save);
        Objects loaded(99);
        const void* memory = loaded.dynamic_col.data();
        ckpt::ParamDict target = loaded.views();
        const auto report = ckpt::load_checkpoint_into(dir / "e.ckpt", target, /*strict=*/true);
        CHECK(report.complete());
        CHECK(loaded.dynamic_col.data() == memory);
        loaded.check_same_as(saved);
        // and into a fresh dictionary: the tensors in their orders
        const ckpt::ParamDict fresh = ckpt::load_checkpoint(dir / "e.ckpt");
        CHECK(fresh == saved.views());
    }
}

TEST_CASE("a row-major file loads into a column-major matrix and back, a square one too, as the same matrix") {
    test::TempDir dir;
    using RowMatrix = Eigen::Matrix<double, Dynamic, Dynamic, RowMajor>;
    for (const Way& way : ways) {
        CAPTURE(way.name);
        // row-major [3, 3] and [2, 5], and a rank-3 tensor, into column-major objects
        RowMatrix square = numbered<RowMatrix>(3, 3), wide = numbered<RowMatrix>(2, 5);
        Eigen::Tensor<float, 3, RowMajor> cube(2, 3, 4);
        fill(cube, 5);
        ckpt::save_checkpoint({{"square", ckpt::view_of(square)}, {"wide", ckpt::view_of(wide)}, {"cube", ckpt::view_of(cube)}},
                              dir / "r.ckpt", way.save);
        Eigen::Matrix3d col_square = Eigen::Matrix3d::Zero();
        Eigen::MatrixXd col_wide = Eigen::MatrixXd::Zero(2, 5);
        Eigen::Tensor<float, 3> col_cube(2, 3, 4);
        col_cube.setZero();
        ckpt::ParamDict target{{"square", ckpt::view_of(col_square)}, {"wide", ckpt::view_of(col_wide)},
                               {"cube", ckpt::view_of(col_cube)}};
        CHECK(ckpt::load_checkpoint_into(dir / "r.ckpt", target, true).complete());
        CHECK(col_square == square);  // element by element: not the transpose
        CHECK(col_square(0, 1) == 1.0);
        CHECK(col_wide == wide);
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 3; ++j)
                for (int k = 0; k < 4; ++k) CHECK(col_cube(i, j, k) == cube(i, j, k));
        // and back: the column-major objects saved, loaded into the row-major ones
        col_square(2, 0) = -7.0;
        ckpt::save_checkpoint(target, dir / "c.ckpt", way.save);
        ckpt::ParamDict back{{"square", ckpt::view_of(square)}, {"wide", ckpt::view_of(wide)}, {"cube", ckpt::view_of(cube)}};
        CHECK(ckpt::load_checkpoint_into(dir / "c.ckpt", back, true).complete());
        CHECK(square == col_square);
        CHECK(square(2, 0) == -7.0);
        CHECK(wide == col_wide);
    }
    // from a ParamDict, as a program's state held by a plain row-major tensor
    Eigen::Matrix2f m = Eigen::Matrix2f::Zero();
    ckpt::ParamDict target{{"m", ckpt::view_of(m)}};
    ckpt::load_param_into_net(target, {{"m", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4}, {2, 2})}}, true);
    CHECK(m(0, 1) == 2.0f);
    CHECK(m(1, 0) == 3.0f);
}

TEST_CASE("EigenState resizes dynamic objects to the file's sizes, through a manager with async saves") {
    test::TempDir dir;
    Eigen::MatrixXd u = numbered<Eigen::MatrixXd>(4, 6);
    Eigen::VectorXf v(5);
    fill(v, 3);
    Eigen::Array<std::int32_t, Dynamic, Dynamic, RowMajor> a(2, 7);
    fill(a, 4);
    Eigen::Matrix<double, Dynamic, 3> three_cols(5, 3);
    fill(three_cols, 6);
    Eigen::Tensor<double, 3> t(3, 1, 2);
    fill(t, 5);
    std::int64_t step = 0;
    {
        ckpt::EigenState state;
        state.add("u", u).add("v", v).add("a", a).add("three_cols", three_cols).add("t", t).add("step", ckpt::view_of(step));
        ckpt::ManagerOptions options;
        options.async_save = true;
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(
            dir.path(), "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, options);
        for (step = 1; step <= 3; ++step) {
            u(0, 0) = static_cast<double>(step);
            mgr.on_step(ckpt::Progress::at_iteration(step), state);
        }
        --step;
        mgr.on_train_end(ckpt::Progress::at_iteration(step), state);
    }
    // default-constructed and wrongly sized objects
    Eigen::MatrixXd u2;
    Eigen::VectorXf v2(1);
    Eigen::Array<std::int32_t, Dynamic, Dynamic, RowMajor> a2(9, 9);
    Eigen::Matrix<double, Dynamic, 3> three_cols2;
    Eigen::Tensor<double, 3> t2;
    std::int64_t step2 = 0;
    ckpt::EigenState state;
    state.add("u", u2).add("v", v2).add("a", a2).add("three_cols", three_cols2).add("t", t2).add("step", step2);
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "sim", ckpt::EverySteps{1},
                                                                                   ckpt::KeepLast{2});
    const auto restored = mgr.restore(state);
    REQUIRE(restored);
    CHECK(step2 == 3);
    CHECK(same_shape(u2, u));
    CHECK(u2 == u);
    CHECK(u2(0, 0) == 3.0);
    CHECK(same_bits(v2, v));
    CHECK(same_shape(a2, a));
    CHECK(same_bits(a2, a));
    CHECK(same_shape(three_cols2, three_cols));
    CHECK(same_bits(three_cols2, three_cols));
    CHECK(t2.dimensions() == t.dimensions());
    CHECK(same_bits(t2, t));
    // a column-major file into a resized row-major matrix: the sizes of the logical shape
    Eigen::Matrix<double, Dynamic, Dynamic, RowMajor> u3;
    ckpt::EigenState row;
    row.add("u", u3);
    ckpt::load_checkpoint_into(restored->file.path, row, /*strict=*/false);
    CHECK(same_shape(u3, u));
    CHECK(u3 == u);
}

TEST_CASE("what an object cannot take is refused, naming the tensor, the file's shape and what it takes") {
    test::TempDir dir;
    Eigen::MatrixXd m = numbered<Eigen::MatrixXd>(2, 3);
    Eigen::Tensor<float, 2> t(2, 2);
    t.setZero();
    Eigen::VectorXd v = Eigen::VectorXd::Ones(4);
    Eigen::Matrix2d w = Eigen::Matrix2d::Identity();
    ckpt::save_checkpoint({{"m", ckpt::view_of(m)}, {"t", ckpt::view_of(t)}, {"v", ckpt::view_of(v)}, {"w", ckpt::view_of(w)}},
                          dir / "f.ckpt");
    struct Case {
        const char* what;
        std::function<void(ckpt::EigenState&)> add;
        const char* message;
    };
    Eigen::Matrix3d fixed = Eigen::Matrix3d::Constant(7);
    Eigen::Matrix<double, Dynamic, 4> four_cols;
    Eigen::Matrix<double, Dynamic, Dynamic, 0, 2, 2> bounded;
    Eigen::MatrixXd vector_as_matrix;
    Eigen::Vector4d fixed_vector;
    Eigen::Tensor<float, 3> rank3;
    const Case cases[] = {
        {"fixed sizes", [&](ckpt::EigenState& s) { s.add("m", fixed); },
         "cannot resize 'm' to the checkpoint's float64[2, 3] column-major: it takes [3, 3] (sizes fixed at compile time)"},
        {"fixed columns", [&](ckpt::EigenState& s) { s.add("m", four_cols); },
         "cannot resize 'm' to the checkpoint's float64[2, 3] column-major: it takes [*, 4]"},
        {"bounded sizes", [&](ckpt::EigenState& s) { s.add("m", bounded); },
         "cannot resize 'm' to the checkpoint's float64[2, 3] column-major: it takes [*, *] (at most [2, 2] at compile time)"},
        {"a matrix from a vector", [&](ckpt::EigenState& s) { s.add("v", vector_as_matrix); },
         "cannot resize 'v' to the checkpoint's float64[4]: it takes [*, *] (a matrix)"},
        {"a vector from a matrix", [&](ckpt::EigenState& s) { s.add("m", fixed_vector); },
         "cannot resize 'm' to the checkpoint's float64[2, 3] column-major: it takes [4] (a vector)"},
        {"another rank", [&](ckpt::EigenState& s) { s.add("t", rank3); },
         "cannot resize 't' to the checkpoint's float32[2, 2] column-major: it takes [*, *, *] (an Eigen::Tensor of rank 3)"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        Eigen::MatrixXd resizable(1, 1);  // added first, fits: the refusal must leave it as it is
        resizable(0, 0) = 42;
        ckpt::EigenState state;
        state.add("w", resizable);
        c.add(state);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "f.ckpt", state, /*strict=*/false),
                             doctest::Contains(c.message), ckpt::LoadMismatch);
        CHECK(resizable.size() == 1);
        CHECK(resizable(0, 0) == 42);
    }
    CHECK(fixed == Eigen::Matrix3d::Constant(7));  // refused before anything was loaded
    CHECK(four_cols.size() == 0);
    // without EigenState a wrongly sized dynamic object is a mismatch like any other
    Eigen::MatrixXd small = Eigen::MatrixXd::Zero(3, 2);
    ckpt::ParamDict views{{"m", ckpt::view_of(small)}};
    const std::string message = "strict load from '" + (dir / "f.ckpt").string() +
                                "' failed: not in the target: 't', 'v', 'w'; dtype/shape mismatch 'm': checkpoint has "
                                "float64[2, 3] column-major, target has float64[3, 2] column-major";
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "f.ckpt", views, true), message.c_str(), ckpt::LoadMismatch);
    CHECK(small == Eigen::MatrixXd::Zero(3, 2));
    // a Map is viewed as it is, never resized; another dtype is not resized either
    std::vector<double> memory(4);
    Eigen::Map<Eigen::MatrixXd> map(memory.data(), 2, 2);
    Eigen::MatrixXf floats;
    ckpt::EigenState state;
    state.add("m", map).add("v", floats);
    const auto report = ckpt::load_checkpoint_into(dir / "f.ckpt", state, false);
    CHECK(report.mismatches.size() == 2);
    CHECK(floats.size() == 0);
    CHECK_THROWS_WITH_AS(state.add("m", floats), "EigenState holds 'm' already", ckpt::ConfigError);
    CHECK_THROWS_AS(state.add("__ckpt.order.m", floats), ckpt::ConfigError);
}

TEST_CASE("a strided Map given at run time is refused, and one that is contiguous after all is viewed") {
    std::vector<double> memory(12);
    Eigen::Map<Eigen::MatrixXd, 0, Eigen::OuterStride<>> gaps(memory.data(), 3, 3, Eigen::OuterStride<>(4));
    CHECK_THROWS_WITH_AS(ckpt::view_of(gaps),
                         doctest::Contains("an Eigen::Map of 3 x 3 elements with inner stride 1 and outer stride 4 is "
                                           "not contiguous"),
                         ckpt::ConfigError);
    Eigen::Map<Eigen::MatrixXd, 0, Eigen::Stride<Dynamic, Dynamic>> every_other(memory.data(), 2, 3,
                                                                                  Eigen::Stride<Dynamic, Dynamic>(4, 2));
    CHECK_THROWS_AS(ckpt::view_of(every_other), ckpt::ConfigError);
    Eigen::Map<Eigen::MatrixXd, 0, Eigen::OuterStride<>> packed(memory.data(), 3, 4, Eigen::OuterStride<>(3));
    CHECK(ckpt::view_of(packed).describe() == "float64[3, 4] column-major");
    Eigen::Map<Eigen::VectorXd, 0, Eigen::InnerStride<>> vector(memory.data(), 12, Eigen::InnerStride<>(1));
    CHECK(ckpt::view_of(vector).describe() == "float64[12]");
}

TEST_CASE("an Eigen matrix saved column-major is the same matrix in NumPy, and through an npz") {
    test::TempDir dir;
    Eigen::MatrixXd m = numbered<Eigen::MatrixXd>(3, 4);
    Eigen::Matrix<std::int32_t, Dynamic, Dynamic, RowMajor> r = numbered<decltype(r)>(2, 3);
    Eigen::Tensor<float, 3> t(2, 3, 4);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) t(i, j, k) = static_cast<float>(100 * i + 10 * j + k);
    Eigen::Matrix3d square = numbered<Eigen::Matrix3d>(3, 3);
    const ckpt::ParamDict views{{"m", ckpt::view_of(m)}, {"r", ckpt::view_of(r)}, {"t", ckpt::view_of(t)},
                                {"square", ckpt::view_of(square)}};
    ckpt::save_checkpoint(views, dir / "eigen.ckpt");
    test::run_python("check_eigen_file.py", dir.path());  // reads dir/eigen.ckpt with the Python package

    // npz: Fortran-ordered members, the bytes as they are, back into the objects bit for bit
    ckpt::save_npz(ckpt::load_checkpoint(dir / "eigen.ckpt"), dir / "eigen.npz");
    const auto npz = ckpt::load_npz(dir / "eigen.npz");
    CHECK(npz == views);
    Eigen::MatrixXd m2 = Eigen::MatrixXd::Zero(3, 4);
    Eigen::Matrix3d square2 = Eigen::Matrix3d::Zero();
    ckpt::ParamDict target{{"m", ckpt::view_of(m2)}, {"square", ckpt::view_of(square2)}};
    ckpt::load_param_into_net(target, npz);
    CHECK(m2 == m);
    CHECK(square2 == square);
}

}  // TEST_SUITE
