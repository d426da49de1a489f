#pragma once
// nn: a small, fast training stack on xtensor and BLAS, with checkpoints from ckpt.
// Include this one header (it includes ckpt/ckpt.hpp).
//
//   layers       Conv2d, MaxPool2d, Dense, MatMul, ReLU, Flatten, Sequential   layers.hpp
//   networks     LeNet5, DataParallelNet, UceNet, SequentialNet             models.hpp
//   training     SoftmaxCrossEntropyWithLogits, Momentum, SGD               loss.hpp, optim.hpp
//   data         MnistDataset, Rescale, Resize, Normalize, HWC2CHW, TypeCast data.hpp
//   loop         Trainer, callbacks, LossMonitor, TimeMonitor              trainer.hpp, callbacks.hpp
//   checkpoints  ModelCheckpoint, make_model_checkpoint, resume             model_checkpoint.hpp
//   tests        FailAtEpochEnd, FailAtStep, InjectedFault                  fault_injection.hpp

#include "../ckpt/ckpt.hpp"
#include "callbacks.hpp"
#include "core.hpp"
#include "data.hpp"
#include "fault_injection.hpp"
#include "init.hpp"
#include "layers.hpp"
#include "loss.hpp"
#include "model_checkpoint.hpp"
#include "models.hpp"
#include "optim.hpp"
#include "trainer.hpp"
