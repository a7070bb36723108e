// The model section's keys (models::ModelOptions), each declared once with its default.

#include "config/key_builders.h"
#include "models/registry.h"

namespace config::schema {

namespace {

// The keys every model reads, or gpt and the sequence model share.
std::vector<KeyDef> common_keys() {
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
      for_models(choice("model.preset", FIELD(model.preset), "gpt2", models::preset_names(),
                        "gpt, llama and its kin: dimensions to start from (the default: each "
                        "family's first: gpt2, llama-tiny, qwen3-tiny, ...); each of "
                        "model.num_layers, heads, d_model (llama: kv_heads, head_dim, "
                        "intermediate_size, rope_*, rms_norm_eps) overrides its own"),
                 models::default_presets()),
      for_models(integer("model.num_layers", FIELD(model.num_layers), "0", 0, 1024,
                         "gpt, llama and its kin: transformer blocks (0: the preset's); sequence: "
                         "LSTM layers or transformer blocks (default 2)"),
                 {{"sequence", "2"}}),
      for_models(integer("model.heads", FIELD(model.heads), "0", 0, 1024,
                         "gpt, llama and its kin, sequence transformer: attention heads, dividing "
                         "model.d_model (0: the preset's; sequence default 4)"),
                 {{"sequence", "4"}}),
      for_models(integer("model.d_model", FIELD(model.d_model), "0", 0, 1 << 16,
                         "gpt, llama and its kin, sequence transformer: width (0: the preset's; "
                         "sequence default 64)"),
                 {{"sequence", "64"}}),
      integer("model.context", FIELD(model.context), "0", 0, 1 << 20,
              "gpt, llama and its kin: positions the model holds (0: data.context)"),
      real("model.dropout", FIELD(model.dropout), "0.0", 0.0, 1.0, false, true,
           "gpt, llama and its kin, sequence: dropout probability"),
      text("model.init_from", FIELD(model.init_from), "",
           "gpt: start from these weights: a Hugging Face GPT-2 directory (config.json + "
           "model.safetensors), a model.safetensors file, or a trainer checkpoint (weights only: a "
           "fresh optimizer at step 1); llama and its kin: a Hugging Face directory of the family "
           "(config.json + model.safetensors, or a sharded model.safetensors.index.json and its "
           "shards); its "
           "dimensions replace the preset's, keys set here must agree; ignored when resuming from "
           "a checkpoint"),
      boolean("model.checkpoint_activations", FIELD(model.checkpoint_activations), "false",
              "gpt, llama and its kin: recompute each block in backward instead of keeping its "
              "activations")};
}

// LoRA's keys (models::LoraOptions through ModelOptions; models/lm/lora.h).
std::vector<KeyDef> lora_keys() {
  return {
      integer("model.lora_rank", FIELD(model.lora_rank), "0", 0, 1 << 16,
              "gpt, llama and its kin: rank of the LoRA adapters (0: none; else the base is frozen "
              "and only "
              "the adapters train)"),
      real("model.lora_alpha", FIELD(model.lora_alpha), "8.0", 0.0, kInf, true, true,
           "gpt, llama and its kin: LoRA's alpha; the adapters' output is scaled by alpha / rank "
           "(PEFT's "
           "default 8)"),
      boolean("model.lora_rslora", FIELD(model.lora_rslora), "false",
              "gpt, llama and its kin: rank-stabilised LoRA: scale by alpha / sqrt(rank) instead "
              "(PEFT's "
              "use_rslora)"),
      real("model.lora_dropout", FIELD(model.lora_dropout), "0.0", 0.0, 1.0, false, true,
           "gpt, llama and its kin: dropout on the adapters' input (training only)"),
      text_list(
          "model.lora_targets", FIELD(model.lora_targets), "[]",
          "gpt, llama and its kin: the adapted layers by their Hugging Face names (llama: q_proj, "
          "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; gpt: c_attn, c_proj, "
          "c_fc); []: the attention projections (llama q, k, v, o_proj; gpt c_attn)"),
      text("model.lora_init_from", FIELD(model.lora_init_from), "",
           "gpt, llama and its kin: start the adapters from this PEFT LoRA adapter directory "
           "(adapter_config.json, adapter_model.safetensors; its r, lora_alpha, use_rslora and "
           "target_modules must be model.lora_rank, lora_alpha, lora_rslora and lora_targets); "
           "ignored when resuming from a checkpoint")};
}

// llama's own keys (models::LlamaOptions through ModelOptions).
std::vector<KeyDef> llama_keys() {
  return {
      integer("model.kv_heads", FIELD(model.kv_heads), "0", 0, 1024,
              "llama: key/value heads, dividing model.heads (fewer: grouped-query attention; 0: "
              "the preset's)"),
      integer("model.head_dim", FIELD(model.head_dim), "0", 0, 1 << 12,
              "llama: width of each attention head, even (0: the preset's, else model.d_model / "
              "model.heads)"),
      integer("model.intermediate_size", FIELD(model.intermediate_size), "0", 0, 1 << 20,
              "llama: hidden size of the SwiGLU MLP (0: the preset's)"),
      real("model.rms_norm_eps", FIELD(model.rms_norm_eps), "0.0", 0.0, 1.0, false, true,
           "llama: RMSNorm epsilon (0: the preset's, 1e-5)"),
      real("model.rope_theta", FIELD(model.rope_theta), "0.0", 0.0, kInf, false, true,
           "llama: rotary embedding base (0: the preset's: 10000, llama-3.2-1b 500000)"),
      choice("model.rope_scaling", FIELD(model.rope_scaling), "auto",
             {"auto", "none", "llama3", "linear"},
             "llama: rotary frequency scaling (llama3: Llama 3.1's, with model.rope_factor, "
             "rope_low_freq_factor, rope_high_freq_factor, rope_original_context; linear: every "
             "frequency over model.rope_factor (gemma3's global layers); auto: the preset's)"),
      real("model.rope_factor", FIELD(model.rope_factor), "0.0", 0.0, kInf, false, true,
           "llama, rope_scaling llama3: how much long wavelengths are slowed (0: the preset's, "
           "else 8)"),
      real("model.rope_low_freq_factor", FIELD(model.rope_low_freq_factor), "0.0", 0.0, kInf, false,
           true,
           "llama, rope_scaling llama3: wavelengths above rope_original_context / this are slowed "
           "(0: the preset's, else 1)"),
      real("model.rope_high_freq_factor", FIELD(model.rope_high_freq_factor), "0.0", 0.0, kInf,
           false, true,
           "llama, rope_scaling llama3: wavelengths below rope_original_context / this are kept "
           "(0: the preset's, else 4)"),
      integer("model.rope_original_context", FIELD(model.rope_original_context), "0", 0, 1 << 24,
              "llama, rope_scaling llama3: the context the model was first trained at (0: the "
              "preset's, else 8192)"),
      boolean("model.attention_bias", FIELD(model.attention_bias), "false",
              "llama: biases on the query/key/value and output projections"),
      boolean("model.mlp_bias", FIELD(model.mlp_bias), "false",
              "llama: biases on the MLP's projections"),
      choice("model.tie_embeddings", FIELD(model.tie_embeddings), "auto", {"auto", "true", "false"},
             "llama and its kin: the output layer is the token embedding (false: a separate "
             "lm_head; auto: the preset's or model.init_from's)"),
      integer("model.sliding_window", FIELD(model.sliding_window), "0", 0, 1 << 24,
              "llama and its kin: sliding-window attention, each query sees this many latest "
              "positions (0: the preset's or model.init_from's; mistral-tiny 64, else none)")};
}

// The sequence model's and the CNN's keys.
std::vector<KeyDef> other_keys() {
  return {
      enum_choice("model.cell", FIELD(model.cell), "lstm", models::kSequenceCellNames,
                  "sequence: the encoder over the window"),
      integer("model.base_channels", FIELD(model.base_channels), "64", 1, 4096,
              "cnn: feature channels of the residual blocks"),
      integer("model.num_blocks", FIELD(model.num_blocks), "8", 0, 1024, "cnn: residual blocks"),
      enum_choice("model.loss", FIELD(model.loss), "l1", models::kCnnLossNames,
                  "cnn: loss against the clean image")};
}

}  // namespace

std::vector<KeyDef> model_keys() {
  std::vector<KeyDef> keys = common_keys();
  for (auto* part : {&llama_keys, &lora_keys, &other_keys}) {
    for (auto& k : part()) keys.push_back(std::move(k));
  }
  return keys;
}

}  // namespace config::schema
