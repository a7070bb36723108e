// ChatPrompt: what `--generate --chat QUESTION` needs to put a user's question into the chat
// template a model was fine-tuned with, without a template engine: the chat.json that
// scripts/tokenize_text.py --chat writes beside its shards (docs/reference.md, "Chat data"), the
// template rendered once around a placeholder user message with the generation prompt.
//
//   prompt ids = before_ids + the question's ids (the run's tokenizer) + after_ids
//   the reply  = the ids sampled after them, up to the first of stop_ids (not spelled)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace data {

inline constexpr const char* kChatPromptName = "chat.json";

struct ChatPrompt {
  std::string path;  // the file read
  std::vector<int64_t> before_ids, after_ids, stop_ids;
  std::string tokenizer;  // the tokenizer.json the shards were made with (as recorded)
  // The template file given with --chat-template (as recorded); "" for the tokenizer's own.
  std::string template_file;
};

// Reads and checks `path` (format "trainer-chat-prompt", version 1, the id lists: non-negative
// integers, at least one stop id). Throws DataError naming the file and the key.
ChatPrompt read_chat_prompt(const std::string& path);

// Where --generate --chat finds it: chat.json in data.path (the folder, or the folder of a shard
// file), else beside model.init_from's weights (its folder, or the folder of a file). Empty when
// neither holds one.
std::string find_chat_prompt(const std::string& data_path, const std::string& init_from);

// before_ids + question + after_ids.
std::vector<int64_t> chat_prompt_ids(const ChatPrompt& chat, const std::vector<int64_t>& question);

}  // namespace data
