// MnistDataset: IDX files plain and gzip, the transforms, batching, the shuffle order and
// set_init_step, and errors that name the file.
#include <doctest/doctest.h>

#include <nn/nn.hpp>
#include <zlib.h>

#include <numeric>
#include <set>

#include "support.hpp"

namespace {

using test::TempDir;

std::vector<char> idx(std::vector<std::uint32_t> dims, const std::vector<std::uint8_t>& data) {
    std::vector<char> out{0, 0, 8, static_cast<char>(dims.size())};
    for (std::uint32_t d : dims)
        for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xff));
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

void write_gz(const boost::filesystem::path& p, const std::vector<char>& bytes) {
    gzFile f = gzopen(p.string().c_str(), "wb");
    REQUIRE(f);
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
}

// n images of h x w where pixel (i, y, x) = i + y * w + x, labels i % 10.
void write_set(const TempDir& dir, const std::string& stem, std::uint32_t n, std::uint32_t h, std::uint32_t w,
               bool gz) {
    std::vector<std::uint8_t> px, lab;
    for (std::uint32_t i = 0; i < n; ++i) {
        for (std::uint32_t j = 0; j < h * w; ++j) px.push_back(static_cast<std::uint8_t>(i + j));
        lab.push_back(static_cast<std::uint8_t>(i % 10));
    }
    const std::string ext = gz ? ".gz" : "";
    auto put = [&](const std::string& name, const std::vector<char>& b) {
        if (gz) write_gz(dir / (name + ext), b);
        else test::write_bytes(dir / name, b);
    };
    put(stem + "-images-idx3-ubyte", idx({n, h, w}, px));
    put(stem + "-labels-idx1-ubyte", idx({n}, lab));
}

std::vector<std::int32_t> labels_of(const nn::MnistDataset& ds, std::int64_t epoch) {
    std::vector<std::int32_t> out;
    nn::Batch b;
    for (std::int64_t s = 0; s < ds.steps_per_epoch(); ++s) {
        ds.load_batch(epoch, s, b);
        out.insert(out.end(), b.labels.begin(), b.labels.end());
    }
    return out;
}

}  // namespace

TEST_CASE("IDX files are read plain and gzipped, train then test for Usage::all") {
    TempDir plain, gz;
    write_set(plain, "train", 5, 3, 4, false);
    write_set(gz, "train", 5, 3, 4, true);
    write_set(gz, "t10k", 2, 3, 4, true);
    nn::MnistDataset a(plain.path(), nn::Usage::train), b(gz.path(), nn::Usage::all), t(gz.path(), nn::Usage::test);
    CHECK(a.size() == 5);
    CHECK(b.size() == 7);
    CHECK(t.size() == 2);
    CHECK(a.sample_shape() == std::vector<std::size_t>{3, 4, 1});
    nn::Batch batch;
    a.batch(2).load_batch(1, 2, batch);  // the remainder: sample 4 alone
    REQUIRE(batch.images.shape() == std::vector<std::size_t>{1, 3, 4, 1});
    CHECK(batch.images(0, 1, 2, 0) == 4 + 1 * 4 + 2);
    CHECK(batch.labels == std::vector<std::int32_t>{4});
    CHECK(a.steps_per_epoch() == 3);
    CHECK(a.batch(2, true).steps_per_epoch() == 2);
    CHECK(b.label(5) == 0);  // the first test sample follows the train samples
    CHECK(b.take(3).size() == 3);
}

TEST_CASE("missing, truncated and malformed files are named in the error") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir / "nope"), doctest::Contains("nope' does not exist"), nn::DataError);
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path()), doctest::Contains("has no MNIST files"), nn::DataError);
    write_set(dir, "train", 4, 2, 2, false);
    boost::filesystem::remove(dir / "train-labels-idx1-ubyte");
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train), doctest::Contains("has no train-labels-idx1-ubyte"),
                         nn::DataError);
    write_set(dir, "train", 4, 2, 2, false);
    auto bytes = test::read_bytes(dir / "train-images-idx3-ubyte");
    bytes.resize(bytes.size() - 3);
    test::write_bytes(dir / "train-images-idx3-ubyte", bytes);
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train),
                         doctest::Contains("train-images-idx3-ubyte' is truncated: it ends inside the data (13 of 16 bytes)"),
                         nn::DataError);
    write_set(dir, "train", 4, 2, 2, false);
    bytes = test::read_bytes(dir / "train-labels-idx1-ubyte");
    bytes[3] = 3;  // claims three dimensions
    test::write_bytes(dir / "train-labels-idx1-ubyte", bytes);
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train),
                         doctest::Contains("is not an IDX file of unsigned bytes with 1 dimensions"), nn::DataError);
    write_set(dir, "train", 4, 2, 2, false);
    test::write_bytes(dir / "train-labels-idx1-ubyte", idx({3}, {1, 2, 3}));
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train),
                         doctest::Contains("holds 4 images but"), nn::DataError);
    test::write_bytes(dir / "train-labels-idx1-ubyte", idx({4}, {1, 2, 12, 3}));
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train),
                         doctest::Contains("train-labels-idx1-ubyte': label 12 of sample 2 is outside the 10 classes"),
                         nn::DataError);
    auto extra = idx({4}, {1, 2, 3, 4});
    extra.push_back(0);
    test::write_bytes(dir / "train-labels-idx1-ubyte", extra);
    CHECK_THROWS_WITH_AS(nn::MnistDataset(dir.path(), nn::Usage::train), doctest::Contains("has bytes after the 4"),
                         nn::DataError);
    test::write_bytes(dir / "train-labels-idx1-ubyte.gz", {'\x1f', '\x8b', 8, 0, 1, 2, 3});
    boost::filesystem::remove(dir / "train-labels-idx1-ubyte");
    CHECK_THROWS_AS(nn::MnistDataset(dir.path(), nn::Usage::train), nn::DataError);
}

TEST_CASE("transforms: Rescale, bilinear Resize with half-pixel centres, Normalize, HWC2CHW") {
    TempDir dir;
    // one 2x2 image: 0 10 / 20 30
    test::write_bytes(dir / "train-images-idx3-ubyte", idx({1, 2, 2}, {0, 10, 20, 30}));
    test::write_bytes(dir / "train-labels-idx1-ubyte", idx({1}, {7}));
    nn::MnistDataset ds(dir.path());
    ds.map({nn::Rescale(0.1, 1.0), nn::Resize(4, 4), nn::Normalize({1.0}, {0.5}), nn::HWC2CHW()});
    CHECK(ds.sample_shape() == std::vector<std::size_t>{1, 4, 4});
    nn::Batch b;
    ds.load_batch(1, 0, b);
    // after Rescale: 1 2 / 3 4; a 4-wide row samples x = -0.25→0, 0.25, 0.75, 1.25→1
    const std::vector<float> row0{1.0f, 1.25f, 1.75f, 2.0f}, row1{1.5f, 1.75f, 2.25f, 2.5f};
    for (std::size_t x = 0; x < 4; ++x) {
        CHECK(b.images(0, 0, 0, x) == doctest::Approx((row0[x] - 1.0) / 0.5));
        CHECK(b.images(0, 0, 1, x) == doctest::Approx((row1[x] - 1.0) / 0.5));
    }
    CHECK(b.labels == std::vector<std::int32_t>{7});
    CHECK_THROWS_AS(ds.map({nn::Normalize({0.1, 0.2}, {1, 1})}), ckpt::ConfigError);
    CHECK_THROWS_AS(nn::MnistDataset(dir.path()).map({nn::HWC2CHW(), nn::Resize(3, 3)}), ckpt::ConfigError);
    CHECK_THROWS_AS(ds.map_label(nn::TypeCast(ckpt::DType::float32)), ckpt::ConfigError);
}

TEST_CASE("shuffle: a permutation per epoch from (seed, epoch), set_init_step resumes the order") {
    TempDir dir;
    write_set(dir, "train", 100, 2, 2, false);
    nn::MnistDataset a(dir.path()), b(dir.path()), c(dir.path());
    a.batch(8, true).shuffle(42);
    b.batch(8, true).shuffle(42);
    c.batch(8, true).shuffle(43);
    const auto e1 = labels_of(a, 1), e2 = labels_of(a, 2);
    CHECK(e1 == labels_of(b, 1));
    CHECK(e1 != e2);
    CHECK(e1 != labels_of(c, 1));
    // within an epoch no sample repeats: pixel (0,0) of sample i is i
    std::set<float> seen;
    nn::Batch batch;
    for (std::int64_t s = 0; s < a.steps_per_epoch(); ++s) {
        a.load_batch(3, s, batch);
        for (std::size_t i = 0; i < batch.labels.size(); ++i) seen.insert(batch.images(i, 0, 0, 0));
    }
    CHECK(seen.size() == 96);
    b.set_init_step(5);
    CHECK(b.take_init_step() == 5);
    CHECK(b.take_init_step() == 0);
    CHECK_THROWS_AS(b.set_init_step(12), ckpt::ConfigError);
    // the order survives a checkpoint of the data state
    nn::MnistDataset d(dir.path());
    d.batch(8, true);
    d.load_state(a.state());
    CHECK(labels_of(d, 2) == e2);
    nn::MnistDataset other_batch(dir.path());
    other_batch.batch(10, true);
    CHECK_THROWS_WITH_AS(other_batch.load_state(a.state()), doctest::Contains("batch size 8 when saved, 10 now"),
                         ckpt::LoadMismatch);
    // another batch size that gives the same number of steps is stopped too: 100 samples make
    // 12 steps of 8 (the remainder dropped) and 12 of 9 (the last one short)
    nn::MnistDataset same_steps(dir.path());
    same_steps.batch(9, false);
    REQUIRE(same_steps.steps_per_epoch() == a.steps_per_epoch());
    CHECK_THROWS_WITH_AS(same_steps.load_state(a.state()), doctest::Contains("batch size 8 when saved, 9 now"),
                         ckpt::LoadMismatch);
    // a data set given another shuffle seed is stopped; one given none takes the checkpoint's
    nn::MnistDataset other_seed(dir.path());
    other_seed.batch(8, true).shuffle(7);
    CHECK_THROWS_WITH_AS(other_seed.load_state(a.state()), doctest::Contains("shuffle seed 42 when saved, 7 now"),
                         ckpt::LoadMismatch);
    // a file written before the batch size was recorded is checked by its steps per epoch
    ckpt::ParamDict old_file{{"data.shuffle", true}, {"data.seed", std::int64_t{1}}, {"data.steps_per_epoch", std::int64_t{12}}};
    CHECK_THROWS_WITH_AS(other_batch.load_state(old_file), doctest::Contains("steps per epoch 12 when saved, 10 now"),
                         ckpt::LoadMismatch);
}

TEST_CASE("Debian's Fashion-MNIST is read from its package layout") {
    nn::MnistDataset test_set(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    CHECK(test_set.size() == 10000);
    CHECK(test_set.sample_shape() == std::vector<std::size_t>{28, 28, 1});
    std::vector<int> counts(10);
    for (std::size_t i = 0; i < test_set.size(); ++i) ++counts.at(static_cast<std::size_t>(test_set.label(i)));
    CHECK(counts == std::vector<int>(10, 1000));
}
