// One training step of LeNet5 and a checkpoint round trip through <nn/nn.hpp> alone: built
// against single_include/ and against an installed package.
#include <nn/nn.hpp>

#include <stdlib.h>

#include <cstdio>

int main() {
    char tmpl[] = "/tmp/ckpt-nn-XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    const boost::filesystem::path dir = tmpl;
    nn::LeNet5 net;
    nn::Momentum opt(net.parameters(), 0.01, 0.9);
    nn::SoftmaxCrossEntropyWithLogits loss;
    nn::Array x = nn::Array::from_shape({2, 1, 32, 32});
    x.fill(0.5f);
    const std::vector<std::int32_t> labels{3, 7};
    const float l = loss.forward(net.forward(x), labels);
    net.backward(loss.backward());
    opt.step();
    ckpt::save_checkpoint(net.state_dict(), dir / "lenet.ckpt");
    nn::LeNet5 other(10, 1, /*seed=*/2);
    const auto report = ckpt::load_checkpoint_into(dir / "lenet.ckpt", other, /*strict=*/true);
    const bool ok = l > 0 && report.complete() && other.parameters()[0]->value == net.parameters()[0]->value;
    boost::filesystem::remove_all(dir);
    std::puts(ok ? "nn single include ok" : "nn single include FAILED");
    return ok ? 0 : 1;
}
