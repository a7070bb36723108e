// Packing documents into windows (data.packing: documents; docs/reference.md, "Chat data"): a
// pure function of the documents' lengths and data.context, so every rank computes the same
// windows, whatever the number of ranks, and the sampler shuffles windows as it shuffles any
// samples.
#pragma once

#include <cstdint>
#include <vector>

namespace data {

// A run of one document's tokens that a window holds: tokens [begin, begin + length) of shard
// `shard`.
struct Piece {
  int64_t begin = 0;
  int64_t length = 0;
  int64_t shard = 0;
};

// The documents (in order, each a Piece over its whole length) cut into pieces of at most
// `context` tokens, in order: a document that fits is one piece; a longer one is split into pieces
// of `context` tokens, each beginning at the last token of the one before, the last one shorter.
// So each of the document's tokens after its first is the target of exactly one position (a
// window never holds the token after its last position). context >= 2.
std::vector<Piece> split_documents(const std::vector<Piece>& documents, int64_t context);

// Windows of `context` positions holding the pieces whole, best-fit decreasing: pieces longest
// first (ties in document order), each into the open window with the least room that still fits it
// (ties: the earliest window), else into a new window. Deterministic. Within a window the pieces
// keep their document order; the rest of the window is padding.
struct PackedWindows {
  std::vector<int64_t> first;  // window w holds pieces[first[w], first[w + 1]); windows + 1 entries
  std::vector<Piece> pieces;   // grouped by window
  int64_t windows() const { return static_cast<int64_t>(first.size()) - 1; }
};
PackedWindows pack_best_fit(const std::vector<Piece>& pieces, int64_t context);

}  // namespace data
