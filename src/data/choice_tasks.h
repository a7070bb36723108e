// Multiple-choice evaluation tasks (HellaSwag and the like): a context and several endings, one of
// them right. train/choice_evaluation.h scores them with a language model; this file only reads
// and checks them. Two formats, chosen by the file name:
//
//   NAME.bin    llm.c's eval file (dev/data/data_common.py, write_evalfile): a header of 256
//               int32 (magic 20240522, version 1, the number of examples, the longest example in
//               bytes), then per example a stream of uint16: 65535 (start of an example), the
//               example's size in bytes (the whole stream, these fields included), its index, the
//               label, the number of endings, the context's length and tokens, then per ending
//               its length and tokens. The ids are GPT-2's (whatever the run's tokenizer is).
//   NAME.jsonl  (any other name) JSON Lines, {"context": "...", "endings": ["...", ...],
//               "label": k} per line, tokenized with the run's tokenizer: the context and each
//               ending separately, then joined, as llm.c does (an ending carries its own leading
//               space, as llm.c's " " + ending).
//
// The task's name is the file's name without its directory and extension ("hellaswag").
// Every check happens on open, and a failure is a DataError naming the file and the example (its
// 0-based number in the file; JSON Lines also the line): a bad header or truncated stream, an id
// at or above the vocabulary, a label out of range, fewer than 2 endings, an empty context or
// ending, or a context and ending longer than the model's positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace data {

struct ChoiceExample {
  std::vector<int64_t> context;
  std::vector<std::vector<int64_t>> endings;
  int64_t label = 0;  // the index of the right ending
};

struct ChoiceTask {
  std::string name;  // the file's stem: what the log, metrics and TensorBoard call it
  std::string path;
  std::vector<ChoiceExample> examples;
};

// Reads and checks `path`. `tokenizer` tokenizes JSON Lines (it may be null for .bin files: a
// JSON Lines file then is a DataError saying so); ids must be below `vocab_size`, and a context
// with any ending must fit `positions` tokens.
ChoiceTask read_choice_task(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
                            int64_t positions);

// The task's name for `path`: its file name without directory and extension.
std::string choice_task_name(const std::string& path);

}  // namespace data
