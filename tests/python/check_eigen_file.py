"""Reads a checkpoint of Eigen objects (tests/test_eigen.cpp) with the Python package and checks
that NumPy sees the same matrices: a column-major MatrixXd and Matrix3d and a column-major
Eigen::Tensor as Fortran-ordered arrays over the file's bytes, a row-major matrix in C order.
   check_eigen_file.py DIR   (DIR holds eigen.ckpt)"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ckpt  # noqa: E402


def main(folder):
    got = ckpt.load(os.path.join(folder, "eigen.ckpt"), mmap=True)  # views of the file's bytes
    i, j = np.indices((3, 4))
    want = {"m": (10 * i + j).astype("<f8"), "r": (10 * np.indices((2, 3))[0] + np.indices((2, 3))[1]).astype("<i4"),
            "t": (100 * np.indices((2, 3, 4))[0] + 10 * np.indices((2, 3, 4))[1] + np.indices((2, 3, 4))[2]).astype("<f4"),
            "square": (10 * np.indices((3, 3))[0] + np.indices((3, 3))[1]).astype("<f8")}
    assert list(got) == list(want), list(got)
    for name, array in want.items():
        a = got[name]
        assert a.dtype == array.dtype and a.shape == array.shape, "%s: %s%s" % (name, a.dtype, a.shape)
        assert (a == array).all(), "%s: values differ\n%s\n%s" % (name, a, array)
        assert not a.flags.writeable, "%s: not a view of the file" % name
    for name in ("m", "t", "square"):
        assert got[name].flags.f_contiguous and not got[name].flags.c_contiguous, "%s: not in Fortran order" % name
    assert got["r"].flags.c_contiguous
    assert got["square"][0, 1] == 1.0 and got["square"][1, 0] == 10.0
    print("numpy read the Eigen objects: the same matrices")


if __name__ == "__main__":
    main(sys.argv[1])
