#include "optim/hyperparams.h"

#include <cmath>

#include "common/check.h"

namespace zs::optim {

void check_lr(double lr, const char* who) {
  ZS_CHECK_VALUE(std::isfinite(lr) && lr >= 0.0, who, ": Invalid learning rate: ", lr);
}

void check_beta(double beta, const char* who, const char* name) {
  ZS_CHECK_VALUE(beta >= 0.0 && beta < 1.0, who, ": Invalid beta parameter ", name,
                 ": expected 0 <= beta < 1; got ", beta);
}

void check_nonnegative(double value, const char* who, const char* name) {
  ZS_CHECK_VALUE(std::isfinite(value) && value >= 0.0, who, ": Invalid ", name,
                 " value: expected a finite value >= 0; got ", value);
}

void check_grad_scale(double scale, const char* who) {
  ZS_CHECK_VALUE(std::isfinite(scale), who, ": grad_scale must be finite; got ", scale);
}

}  // namespace zs::optim
