#include "models/lm/family.h"

namespace models {

void require_token_data(const core::Shape& shape, const std::string& family) {
  if (shape.vocab_size <= 0 || shape.context <= 0) {
    throw std::invalid_argument(fmt::format(
        "model.name: {} needs token data (data.dataset: tokens) (data.dataset gives none)",
        family));
  }
}

void require_context_fits(const core::Shape& shape, int64_t model_context) {
  if (shape.context > model_context) {
    throw std::invalid_argument(fmt::format(
        "data.context = {} is longer than model.context = {} (the positions the model sees)",
        shape.context, model_context));
  }
}

}  // namespace models
