// The training stack's arithmetic: gradients against finite differences, convolution
// against a direct loop, the optimizers against their formulas, determinism.
#include <doctest/doctest.h>

#include <nn/nn.hpp>

#include <cmath>
#include <random>

namespace {

nn::Array random_array(std::vector<std::size_t> shape, std::uint64_t seed, float scale = 1.0f) {
    nn::Array a = nn::Array::from_shape(shape);
    std::mt19937_64 g(seed);
    nn::Uniform{scale}(a, g);
    return a;
}

template <class Net>
float loss_of(Net& net, const nn::Array& x, const std::vector<std::int32_t>& labels) {
    nn::SoftmaxCrossEntropyWithLogits loss;
    return loss.forward(net.forward(x), labels);
}

// Checks d loss / d p for a sample of every parameter's elements, by central differences.
// An element whose perturbation moves a ReLU or max-pool input across its kink shows
// one-sided differences that disagree; it is skipped, and few may be.
template <class Net>
void check_gradients(Net& net, const nn::Array& x, const std::vector<std::int32_t>& labels) {
    nn::SoftmaxCrossEntropyWithLogits loss;
    const double base = loss.forward(net.forward(x), labels);
    net.backward(loss.backward());
    std::size_t checked = 0, at_kinks = 0;
    for (nn::Parameter* p : net.parameters()) {
        const nn::Array analytic = p->grad;
        const std::size_t n = p->value.size(), stride = std::max<std::size_t>(1, n / 7);
        for (std::size_t i = 0; i < n; i += stride) {
            const float keep = p->value.data()[i], eps = 1e-3f;
            p->value.data()[i] = keep + eps;
            const double up = loss_of(net, x, labels);
            p->value.data()[i] = keep - eps;
            const double down = loss_of(net, x, labels);
            p->value.data()[i] = keep;
            const double numeric = (up - down) / (2.0 * eps);
            ++checked;
            if (std::abs((up - base) - (base - down)) / eps > 2e-3 + 0.05 * std::abs(numeric)) {
                ++at_kinks;
                continue;
            }
            INFO(p->name << "[" << i << "]: analytic " << analytic.data()[i] << ", numeric " << numeric);
            CHECK(std::abs(analytic.data()[i] - numeric) <= 2e-3 + 2e-2 * std::abs(numeric));
        }
    }
    CHECK(at_kinks * 10 <= checked);
}

}  // namespace

TEST_CASE("LeNet5 gradients match finite differences") {
    nn::LeNet5 net(10, 1, 3);
    const nn::Array x = random_array({3, 1, 32, 32}, 11);
    check_gradients(net, x, {1, 4, 9});
}

TEST_CASE("strided, same-padded convolution with bias: gradients of every layer, inputs included") {
    using Layers = nn::Sequential<nn::ToChannelMajor, nn::Conv2d, nn::ReLU, nn::Conv2d, nn::MaxPool2d,
                                  nn::FlattenChannelMajor, nn::Dense>;
    nn::SequentialNet<Layers> net(
        "convs",
        Layers(nn::ToChannelMajor{}, nn::Conv2d("c1", 2, 3, 3, {.stride = 1, .pad_mode = nn::Padding::same, .has_bias = true}),
               nn::ReLU{}, nn::Conv2d("c2", 3, 4, 3, {.stride = 2, .pad_mode = nn::Padding::same, .has_bias = true}),
               nn::MaxPool2d(2, 2), nn::FlattenChannelMajor{}, nn::Dense("fc", 4 * 2 * 2, 5)),
        {2, 9, 9}, 5);
    // c2 turns 9x9 into ceil(9/2) = 5x5, the pool into 2x2
    const nn::Array x = random_array({2, 2, 9, 9}, 12);
    check_gradients(net, x, {0, 3});
}

TEST_CASE("the seed's MLPs: gradients through MatMul and Dense") {
    nn::UceNet net(4);
    const nn::Array x = random_array({2, 1, 28, 28}, 13, 0.5f);
    check_gradients(net, x, {2, 8});
    CHECK(net.parameters()[0]->name == "layer1.param");
    CHECK(net.parameters()[0]->value.shape() == std::vector<std::size_t>{784, 512});
}

TEST_CASE("Conv2d equals a direct convolution, and ToChannelMajor/FlattenChannelMajor invert each other") {
    const std::size_t n = 2, c = 3, h = 7, w = 6, o = 2, k = 3;
    std::size_t s = 2;
    nn::Padding pad = nn::Padding::same;
    SUBCASE("same padding, stride 2") {}
    SUBCASE("valid, stride 1 (the unpadded fast path)") {
        s = 1;
        pad = nn::Padding::valid;
    }
    nn::Conv2d conv("c", c, o, k, {.stride = s, .pad_mode = pad, .has_bias = true});
    std::mt19937_64 g(7);
    conv.initialize(g);
    std::vector<nn::Parameter*> params;
    conv.parameters(params);
    const nn::Array x = random_array({n, c, h, w}, 21);
    nn::ToChannelMajor to_cm;
    const nn::Array y = conv.forward(to_cm.forward(x));
    const bool same = pad == nn::Padding::same;
    const std::size_t oh = same ? (h + s - 1) / s : (h - k) / s + 1, ow = same ? (w + s - 1) / s : (w - k) / s + 1;
    REQUIRE(y.shape() == std::vector<std::size_t>{o, n, oh, ow});
    const std::size_t pt = same ? ((oh - 1) * s + k - h) / 2 : 0, pl = same ? ((ow - 1) * s + k - w) / 2 : 0;
    const nn::Array& wt = params[0]->value;
    for (std::size_t b = 0; b < n; ++b)
        for (std::size_t oc = 0; oc < o; ++oc)
            for (std::size_t i = 0; i < oh; ++i)
                for (std::size_t j = 0; j < ow; ++j) {
                    double acc = params[1]->value(oc);
                    for (std::size_t ic = 0; ic < c; ++ic)
                        for (std::size_t a = 0; a < k; ++a)
                            for (std::size_t bb = 0; bb < k; ++bb) {
                                const long ih = long(i * s + a) - long(pt), iw = long(j * s + bb) - long(pl);
                                if (ih < 0 || iw < 0 || ih >= long(h) || iw >= long(w)) continue;
                                acc += double(wt(oc, ic, a, bb)) * x(b, ic, std::size_t(ih), std::size_t(iw));
                            }
                    CHECK(y(oc, b, i, j) == doctest::Approx(acc).epsilon(1e-5));
                }
    nn::FlattenChannelMajor flat;
    const nn::Array rows = flat.forward(to_cm.forward(x));
    REQUIRE(rows.shape() == std::vector<std::size_t>{n, c * h * w});
    CHECK(std::equal(rows.begin(), rows.end(), x.begin()));  // (N, C·H·W) in C, H, W order
    CHECK(to_cm.backward(flat.backward(rows)) == x);
}

TEST_CASE("MaxPool2d routes the gradient to the first maximum") {
    nn::MaxPool2d pool(2, 2);
    nn::Array x = nn::Array::from_shape({1, 1, 2, 4});
    x = nn::Array{{{{1, 5, 2, 2}, {5, 0, 2, 1}}}};
    const nn::Array& y = pool.forward(x);
    CHECK(y == nn::Array{{{{5, 2}}}});
    const nn::Array& dx = pool.backward(nn::Array{{{{1, 10}}}});
    CHECK(dx == nn::Array{{{{0, 1, 10, 0}, {0, 0, 0, 0}}}});
}

TEST_CASE("SoftmaxCrossEntropyWithLogits: value, gradient, and bad labels named") {
    nn::SoftmaxCrossEntropyWithLogits loss;
    const nn::Array logits{{0.0f, std::log(3.0f)}, {5.0f, 5.0f}};
    const float l = loss.forward(logits, std::vector<std::int32_t>{1, 0});
    CHECK(l == doctest::Approx((-std::log(0.75) - std::log(0.5)) / 2).epsilon(1e-6));
    CHECK(loss.backward()(0, 0) == doctest::Approx(0.25 / 2));
    CHECK(loss.backward()(0, 1) == doctest::Approx(-0.25 / 2));
    CHECK_THROWS_WITH_AS(loss.forward(logits, std::vector<std::int32_t>{1, 2}),
                         doctest::Contains("label 2 of sample 1 in the batch is outside the 2 classes"), nn::DataError);
    CHECK_THROWS_AS(loss.forward(logits, std::vector<std::int32_t>{1}), nn::ShapeError);
    nn::SoftmaxCrossEntropyWithLogits dense(false, nn::Reduction::sum);
    CHECK(dense.forward(logits, nn::Array{{0.0f, 1.0f}, {1.0f, 0.0f}}) == doctest::Approx(-std::log(0.75) - std::log(0.5)));
}

TEST_CASE("Momentum and SGD follow their formulas, with state named after the parameters") {
    nn::Parameter p{"w", nn::Array{1.0f, -2.0f}, nn::Array{0.5f, 0.25f}};
    SUBCASE("Momentum") {
        nn::Momentum opt({&p}, 0.1, 0.9);
        opt.step();  // a = g; p -= lr a
        opt.step();  // a = 0.9 a + g = 1.9 g
        CHECK(p.value(0) == doctest::Approx(1.0 - 0.1 * 0.5 - 0.1 * 1.9 * 0.5));
        CHECK(opt.state_dict().tensor("moments.w").values<float>()[1] == doctest::Approx(1.9 * 0.25));
        CHECK(opt.hyperparameters().get<double>("momentum") == 0.9);
    }
    SUBCASE("Momentum, nesterov and weight decay") {
        nn::Momentum opt({&p}, 0.1, 0.9, 0.01, true);
        opt.step();
        const double g = 0.5 + 0.01 * 1.0, a = g;
        CHECK(p.value(0) == doctest::Approx(1.0 - 0.1 * (g + 0.9 * a)));
    }
    SUBCASE("SGD with momentum and dampening: the first step takes the gradient as it is") {
        nn::SGD opt({&p}, 0.1, 0.9, 0.5);
        opt.step();
        CHECK(p.value(0) == doctest::Approx(1.0 - 0.1 * 0.5));
        opt.step();  // a = 0.9 * 0.5 + 0.5 * 0.5
        CHECK(p.value(0) == doctest::Approx(1.0 - 0.1 * 0.5 - 0.1 * (0.9 * 0.5 + 0.5 * 0.5)));
        CHECK(opt.state_dict().tensor("stat").values<float>()[0] == 0.0f);
        CHECK(opt.state_dict().contains("accum.w"));
    }
    CHECK_THROWS_AS(nn::Momentum({&p}, -0.1, 0.9), ckpt::ConfigError);
}

TEST_CASE("initializers: the seed's bounds and fan-in rule, and the same values for the same seed") {
    nn::Array w = nn::Array::from_shape({784, 512});
    std::mt19937_64 g(1);
    nn::HeUniform{nn::sqrt5}(w, g);
    // the seed's fan-in of a 2-D (a, b) tensor is b: HeUniform(√5) bound 1/sqrt(512)
    CHECK(*std::max_element(w.begin(), w.end()) <= 1.0f / std::sqrt(512.0f));
    CHECK(*std::max_element(w.begin(), w.end()) > 0.99f / std::sqrt(512.0f));
    nn::Array n = nn::Array::from_shape({10000});
    nn::Normal{0.02}(n, g);
    double sum2 = 0;
    for (float v : n) sum2 += double(v) * v;
    CHECK(std::sqrt(sum2 / 10000) == doctest::Approx(0.02).epsilon(0.03));
    nn::LeNet5 a(10, 1, 9), b(10, 1, 9), c(10, 1, 10);
    CHECK(a.parameters()[2]->value == b.parameters()[2]->value);
    CHECK(a.parameters()[2]->value != c.parameters()[2]->value);
    CHECK(a.parameters()[2]->name == "fc1.weight");
}

TEST_CASE("a network rejects input of another shape, naming both") {
    nn::LeNet5 net;
    CHECK_THROWS_WITH_AS(net.forward(nn::Array::from_shape({4, 1, 28, 28})),
                         doctest::Contains("LeNet5 expects a batch of shape (N, 1, 32, 32), got (4, 1, 28, 28)"),
                         nn::ShapeError);
}

TEST_CASE("training steps are deterministic") {
    auto run = [] {
        nn::LeNet5 net(10, 1, 5);
        nn::Momentum opt(net.parameters(), 0.01, 0.9);
        nn::SoftmaxCrossEntropyWithLogits loss;
        for (int i = 0; i < 3; ++i) {
            loss.forward(net.forward(random_array({8, 1, 32, 32}, 100 + i)), std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
            net.backward(loss.backward());
            opt.step();
        }
        std::vector<float> all;
        for (auto* p : net.parameters()) all.insert(all.end(), p->value.begin(), p->value.end());
        return all;
    };
    CHECK(run() == run());
}
