// The model section's keys (models::ModelOptions), each declared once with its default.

#include "config/key_builders.h"
#include "models/gpt/gpt.h"
#include "models/registry.h"

namespace config::schema {

std::vector<KeyDef> model_keys() {
  return {
      choice("model.name", FIELD(model.name), "", models::model_names(),
             "model to train, from the model zoo"),
      integer("model.hidden_dim", FIELD(model.hidden_dim), "256", 1, 1 << 20,
              "width of each hidden layer"),
      integer("model.depth", FIELD(model.depth), "2", 0, 256, "number of hidden layers"),
      integer("model.embedding_dim", FIELD(model.embedding_dim), "64", 1, 1 << 16,
              "recommender: user and item vector size (also the text encoder's output)"),
      integer("model.encoder_dim", FIELD(model.encoder_dim), "64", 1, 1 << 16,
              "recommender: width of the frozen text encoder"),
      integer("model.encoder_layers", FIELD(model.encoder_layers), "2", 0, 128,
              "recommender: transformer blocks of the text encoder"),
      integer("model.encoder_heads", FIELD(model.encoder_heads), "4", 1, 256,
              "recommender: attention heads (must divide model.encoder_dim)"),
      integer("model.text_len", FIELD(model.text_len), "0", 0, 1 << 16,
              "recommender: text encoder positions (0: data.text_len)"),
      text("model.encoder_weights", FIELD(model.encoder_weights), "",
           "recommender: safetensors file with the text encoder's weights (empty: seeded random)"),
      choice("model.preset", FIELD(model.preset), "gpt2", models::gpt_preset_names(),
             "gpt: dimensions to start from; each of model.num_layers, heads, d_model overrides "
             "its own"),
      for_models(integer("model.num_layers", FIELD(model.num_layers), "0", 0, 1024,
                         "gpt: transformer blocks (0: the preset's); sequence: LSTM layers or "
                         "transformer blocks (default 2)"),
                 {{"sequence", "2"}}),
      for_models(integer("model.heads", FIELD(model.heads), "0", 0, 1024,
                         "gpt, sequence transformer: attention heads, dividing model.d_model (gpt "
                         "0: the preset's; sequence default 4)"),
                 {{"sequence", "4"}}),
      for_models(integer("model.d_model", FIELD(model.d_model), "0", 0, 1 << 16,
                         "gpt, sequence transformer: width (gpt 0: the preset's; sequence default "
                         "64)"),
                 {{"sequence", "64"}}),
      integer("model.context", FIELD(model.context), "0", 0, 1 << 20,
              "gpt: positions the model holds (0: data.context)"),
      real("model.dropout", FIELD(model.dropout), "0.0", 0.0, 1.0, false, true,
           "gpt, sequence: dropout probability"),
      text("model.init_from", FIELD(model.init_from), "",
           "gpt: start from these weights: a Hugging Face GPT-2 directory (config.json + "
           "model.safetensors), a model.safetensors file, or a trainer checkpoint (weights only: "
           "a fresh optimizer at step 1); its dimensions replace the preset's, keys set here "
           "must agree; ignored when resuming from a checkpoint"),
      boolean("model.checkpoint_activations", FIELD(model.checkpoint_activations), "false",
              "gpt: recompute each block in backward instead of keeping its activations"),
      enum_choice("model.cell", FIELD(model.cell), "lstm", models::kSequenceCellNames,
                  "sequence: the encoder over the window"),
      integer("model.base_channels", FIELD(model.base_channels), "64", 1, 4096,
              "cnn: feature channels of the residual blocks"),
      integer("model.num_blocks", FIELD(model.num_blocks), "8", 0, 1024, "cnn: residual blocks"),
      enum_choice("model.loss", FIELD(model.loss), "l1", models::kCnnLossNames,
                  "cnn: loss against the clean image")};
}

}  // namespace config::schema
