// Must not compile: a view of an Eigen expression (here a transpose), which has no memory of
// its own to view. Expected diagnostic: the static_assert that says to evaluate it first.
#include <ckpt/types/eigen.hpp>

int main() {
    Eigen::MatrixXd m(2, 3);
    ckpt::Tensor t = ckpt::view_of(m.transpose());
    (void)t;
}
