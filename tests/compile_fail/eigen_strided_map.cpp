// Must not compile: a view of an Eigen::Map whose inner stride, fixed at compile time, puts its
// elements apart (every other element of a buffer): no contiguous tensor can view them.
// Expected diagnostic: the static_assert on the Map's inner stride.
#include <ckpt/types/eigen.hpp>

int main() {
    double buffer[8] = {};
    Eigen::Map<Eigen::VectorXd, Eigen::Unaligned, Eigen::InnerStride<2>> every_other(buffer, 4);
    ckpt::Tensor t = ckpt::view_of(every_other);
    (void)t;
}
