// Checks of optimizer hyperparameters shared by the front ends. Messages match the
// torch.optim ones users know ("Invalid learning rate: -1.0") and name the optimizer.
#pragma once

namespace zs::optim {

void check_lr(double lr, const char* who);
void check_beta(double beta, const char* who, const char* name);
void check_nonnegative(double value, const char* who, const char* name);
void check_grad_scale(double scale, const char* who);

}  // namespace zs::optim
