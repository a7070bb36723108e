// Token shards with a loss mask and document boundaries beside them (scripts/tokenize_text.py
// --chat): masked targets, packed windows of whole documents (positions, padding, split
// documents), the per-window target counts, the packing report, and every malformed file named
// with its byte offset.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <numeric>
#include <random>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/chat_shards.h"
#include "common/error_of.h"
#include "common/temp_dir.h"
#include "core/shape.h"
#include "data/errors.h"
#include "data/loader.h"
#include "data/readers.h"
#include "data/token_packing.h"
#include "data/token_shards.h"

namespace TRAINER_UNITY_ID {

using test::append;
using test::Doc;
using test::header;
using test::write_bytes;
using test::write_chat_shard;
using ::testing::HasSubstr;
constexpr int64_t kIgnore = core::kIgnoreTarget;

// Document d of `lengths`: tokens numbered on from `first` (so every token of a data set is
// distinct and names its place), the mask 1 on the second half (the "assistant's reply").
std::vector<Doc> make_docs(const std::vector<int64_t>& lengths, int64_t first = 1) {
  std::vector<Doc> docs;
  for (const int64_t n : lengths) {
    Doc d;
    for (int64_t i = 0; i < n; ++i) {
      d.tokens.push_back(static_cast<uint16_t>(first++));
      d.mask.push_back(i >= n / 2 ? 1 : 0);
    }
    docs.push_back(std::move(d));
  }
  return docs;
}

std::string error_of(const std::function<void()>& fn) {
  return test::error_of<data::DataError>(fn);
}

at::Tensor all_windows(const data::Dataset& ds) { return at::arange(ds.size(), at::kLong); }

TEST(TokenPacking, SplitDocumentsOverlapByOneTokenSoEveryTargetIsTrainedOnce) {
  const std::vector<data::Piece> docs = {{0, 1, 0}, {1, 5, 0}, {6, 12, 0}, {0, 11, 1}};
  const auto pieces = data::split_documents(docs, 5);
  // 12 tokens in pieces of 5, each beginning at the last token of the one before: 6+5, 10+5, 14+4
  const std::vector<std::array<int64_t, 3>> expected = {
      {0, 1, 0}, {1, 5, 0}, {6, 5, 0}, {10, 5, 0}, {14, 4, 0}, {0, 5, 1}, {4, 5, 1}, {8, 3, 1}};
  ASSERT_EQ(pieces.size(), expected.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ((std::array<int64_t, 3>{pieces[i].begin, pieces[i].length, pieces[i].shard}),
              expected[i])
        << i;
  }
  // Each token after a document's first is the target of exactly one position (a piece's tokens
  // after its first).
  std::map<std::pair<int64_t, int64_t>, int> targeted;
  for (const auto& p : pieces) {
    for (int64_t t = p.begin + 1; t < p.begin + p.length; ++t) ++targeted[{p.shard, t}];
  }
  for (const auto& d : docs) {
    for (int64_t t = d.begin + 1; t < d.begin + d.length; ++t) {
      EXPECT_EQ((targeted[{d.shard, t}]), 1) << d.shard << ":" << t;
    }
  }
  EXPECT_THROW(data::split_documents(docs, 1), std::invalid_argument);
}

// Pieces of these lengths, one after another in shard 0.
std::vector<data::Piece> pieces_of(std::initializer_list<int64_t> lengths) {
  std::vector<data::Piece> pieces;
  int64_t at = 0;
  for (const int64_t n : lengths) {
    pieces.push_back({at, n, 0});
    at += n;
  }
  return pieces;
}

// The lengths of each window's pieces, in order.
std::vector<std::vector<int64_t>> window_lengths(const data::PackedWindows& packed) {
  std::vector<std::vector<int64_t>> lengths(static_cast<size_t>(packed.windows()));
  for (int64_t w = 0; w < packed.windows(); ++w) {
    for (int64_t p = packed.first[w]; p < packed.first[w + 1]; ++p) {
      lengths[w].push_back(packed.pieces[p].length);
    }
  }
  return lengths;
}

TEST(TokenPacking, BestFitDecreasingFillsTheTightestWindowFirst) {
  // context 10, lengths 6 5 4 3 2: 6 -> w0 (4 left), 5 -> w1 (5 left), 4 -> w0 (fits exactly),
  // 3 -> w1 (2 left), 2 -> w1: two full windows (next-fit in order would need three).
  const auto lengths = window_lengths(data::pack_best_fit(pieces_of({2, 6, 5, 4, 3}), 10));
  ASSERT_EQ(lengths.size(), 2u);
  EXPECT_EQ(lengths[0], (std::vector<int64_t>{6, 4}));     // document order within a window
  EXPECT_EQ(lengths[1], (std::vector<int64_t>{2, 5, 3}));  // the 2 came first in the documents
  // The tightest window, not the first that fits: 7 -> w0 (3 left), 4 -> w1 (6 left), 4 -> w1 (2
  // left), 2 -> w1 (exactly), where first-fit would put the 2 beside the 7.
  EXPECT_EQ(window_lengths(data::pack_best_fit(pieces_of({4, 2, 7, 4}), 10)),
            (std::vector<std::vector<int64_t>>{{7}, {4, 2, 4}}));
}

TEST(TokenPacking, EveryPieceLandsOnceInAWindowThatHoldsIt) {
  std::mt19937 rng(7);
  std::vector<data::Piece> pieces;
  int64_t total = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 64);
    pieces.push_back({total, n, 0});
    total += n;
  }
  const auto packed = data::pack_best_fit(pieces, 64);
  const auto again = data::pack_best_fit(pieces, 64);
  EXPECT_EQ(packed.first, again.first);  // deterministic
  std::vector<int> seen(pieces.size(), 0);
  for (int64_t w = 0; w < packed.windows(); ++w) {
    int64_t used = 0, last_begin = -1;
    for (int64_t p = packed.first[w]; p < packed.first[w + 1]; ++p) {
      const auto& piece = packed.pieces[p];
      used += piece.length;
      EXPECT_GT(piece.begin, last_begin) << "document order within window " << w;
      last_begin = piece.begin;
      const auto it = std::find_if(pieces.begin(), pieces.end(),
                                   [&](const data::Piece& q) { return q.begin == piece.begin; });
      ASSERT_NE(it, pieces.end());
      ++seen[it - pieces.begin()];
    }
    EXPECT_LE(used, 64) << w;
    EXPECT_GT(used, 0) << w;
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  // Near the bound: uniform lengths 1..64 fill more than 98% of the positions, and fewer windows
  // than next-fit in document order (each piece into the last window, else a new one).
  EXPECT_LE(packed.windows(), (total + 63) / 64 * 102 / 100) << total;
  int64_t next_fit = 0, room = 0;
  for (const auto& p : pieces) {
    if (p.length > room) {
      ++next_fit;
      room = 64;
    }
    room -= p.length;
  }
  EXPECT_LT(packed.windows(), next_fit);
  std::printf("%lld tokens: best-fit decreasing %lld windows, next-fit %lld, bound %lld\n",
              static_cast<long long>(total), static_cast<long long>(packed.windows()),
              static_cast<long long>(next_fit), static_cast<long long>((total + 63) / 64));
}

// Checks a packed batch of every window against the documents, independently of the packer: each
// window's positions restart at 0 where a document (piece) begins; its tokens are consecutive
// tokens of one document; each target is the next token of that document where its mask is 1,
// else ignored (the last position of a piece always); padding is input 0, target ignored, positions
// counting on; and every masked-in token after a document's first is the target of exactly one
// position over the whole data set.
void expect_packed_batch_matches_documents(const data::Batch& b, const std::vector<Doc>& docs,
                                           int64_t context) {
  std::map<int64_t, std::pair<size_t, size_t>> where;  // token -> (document, index)
  for (size_t d = 0; d < docs.size(); ++d) {
    for (size_t i = 0; i < docs[d].tokens.size(); ++i) where[docs[d].tokens[i]] = {d, i};
  }
  std::map<int64_t, int> targeted;
  ASSERT_TRUE(b.positions.defined());
  const int64_t n = b.inputs.size(0);
  for (int64_t w = 0; w < n; ++w) {
    const auto in = b.inputs[w], tg = b.targets[w], pos = b.positions[w];
    int64_t j = 0;
    while (j < context && in[j].item<int64_t>() != data::kPadInput) {
      ASSERT_EQ(pos[j].item<int64_t>(), 0) << "window " << w << " position " << j;
      const auto [d, first] = where.at(in[j].item<int64_t>());
      const Doc& doc = docs[d];
      int64_t k = 0;
      for (; j + k < context && (k == 0 || pos[j + k].item<int64_t>() != 0); ++k) {
        if (in[j + k].item<int64_t>() == data::kPadInput) break;
        ASSERT_EQ(pos[j + k].item<int64_t>(), k);
        ASSERT_EQ(in[j + k].item<int64_t>(), doc.tokens.at(first + k));
      }
      for (int64_t i = 0; i < k; ++i) {  // the piece is tokens [first, first + k) of doc d
        const size_t next = first + i + 1;
        const bool counted = i + 1 < k && doc.mask[next] == 1;
        ASSERT_EQ(tg[j + i].item<int64_t>(), counted ? doc.tokens[next] : kIgnore)
            << "window " << w << " position " << j + i;
        if (counted) ++targeted[doc.tokens[next]];
      }
      j += k;
    }
    for (int64_t p = j; p < context; ++p) {  // padding
      EXPECT_EQ(in[p].item<int64_t>(), data::kPadInput);
      EXPECT_EQ(tg[p].item<int64_t>(), kIgnore);
      EXPECT_EQ(pos[p].item<int64_t>(), p - j);
    }
  }
  for (const Doc& doc : docs) {
    for (size_t i = 1; i < doc.tokens.size(); ++i) {
      EXPECT_EQ(targeted[doc.tokens[i]], doc.mask[i]) << "token " << doc.tokens[i];
    }
  }
}

TEST(TokenDocuments, PackedWindowsHoldWholeDocumentsWithTheirPositionsAndMaskedTargets) {
  test::TempDir dir;
  constexpr int64_t kContext = 16;
  // Documents of 1, 3, context - 1, exactly context, and longer than the context (split into
  // pieces of 16, 16 and 7 tokens), over two shards.
  const auto a = make_docs({1, 3, kContext - 1, kContext});
  const auto b = make_docs({kContext * 2 + 5, 9, 2}, 1000);
  write_chat_shard(dir.path() + "/train_000000", a);
  write_chat_shard(dir.path() + "/train_000001", b);
  data::TokenShardDataset ds({dir.path() + "/train_000000.bin", dir.path() + "/train_000001.bin"},
                             kContext, 2000);
  EXPECT_EQ(ds.packing_mode(), data::Packing::kDocuments);  // auto: the shards carry boundaries
  std::vector<Doc> docs = a;
  docs.insert(docs.end(), b.begin(), b.end());
  const data::Batch batch = ds.get(all_windows(ds));
  expect_packed_batch_matches_documents(batch, docs, kContext);

  const auto stats = ds.packing();
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->documents, 7);
  EXPECT_EQ(stats->split_documents, 1);
  EXPECT_EQ(stats->pieces, 3);
  EXPECT_EQ(stats->windows, ds.size());
  EXPECT_EQ(stats->tokens, (batch.inputs != data::kPadInput).sum().item<int64_t>());
  EXPECT_EQ(stats->targets, (batch.targets != kIgnore).sum().item<int64_t>());
  EXPECT_THAT(data::packing_line(*stats),
              HasSubstr("data.packing: documents: " + std::to_string(ds.size()) +
                        " windows of 16 positions"));
  EXPECT_THAT(data::packing_line(*stats),
              HasSubstr("7 documents, 1 of them longer than data.context, split into 3 pieces"));
  // Positions stay below the context (learned position tables have `context` rows).
  EXPECT_LT(batch.positions.max().item<int64_t>(), kContext);
}

TEST(TokenDocuments, TargetCountEqualsTheTargetsGetReturns) {
  test::TempDir dir;
  write_chat_shard(dir.path() + "/train_000000", make_docs({5, 40, 3, 17, 8, 1, 30, 12, 64, 2}));
  const std::string shard = dir.path() + "/train_000000.bin";
  for (const auto packing : {data::Packing::kDocuments, data::Packing::kNone}) {
    data::TokenShardDataset ds({shard}, 12, 1000, {}, packing);
    std::mt19937 rng(3);
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % ds.size());
      const at::Tensor idx = at::randint(ds.size(), {n}, at::kLong);
      EXPECT_EQ(ds.target_count(idx), (ds.get(idx).targets != kIgnore).sum().item<int64_t>());
    }
    EXPECT_THROW(ds.target_count(at::tensor({ds.size()}, at::kLong)), std::out_of_range);
  }
  // Without a mask every target counts: `context` per window, as before.
  test::TempDir plain;
  write_chat_shard(plain.path() + "/train", make_docs({100}), /*mask=*/false,
                   /*boundaries=*/false);
  data::TokenShardDataset ds({plain.path() + "/train.bin"}, 12, 1000);
  EXPECT_EQ(ds.target_count(at::tensor({0, 3, 3}, at::kLong)), 36);
  EXPECT_FALSE(ds.packing().has_value());
  EXPECT_FALSE(ds.get(at::tensor({0}, at::kLong)).positions.defined());
}

TEST(TokenDocuments, UnpackedWindowsWithAMaskIgnoreTheMaskedTargets) {
  test::TempDir dir;
  const auto docs = make_docs({10, 6, 9});
  write_chat_shard(dir.path() + "/train", docs);
  data::DataOptions o;
  o.path = dir.path();
  o.context = 4;
  o.vocab_size = 100;
  o.packing = data::Packing::kNone;
  auto ds = data::make_token_dataset(o);
  EXPECT_EQ(ds->size(), 6);  // (25 - 1) / 4, as without a mask
  const auto b = ds->get(at::tensor({0, 2}, at::kLong));
  EXPECT_FALSE(b.positions.defined());
  // Tokens 1..10 (mask 0 0 0 0 0 1 1 1 1 1), 11..16 (0 0 0 1 1 1), 17..25 (0 0 0 0 1 1 1 1 1).
  EXPECT_TRUE(at::equal(b.inputs[0], at::tensor({1, 2, 3, 4}, at::kLong)));
  EXPECT_TRUE(at::equal(b.targets[0], at::tensor({kIgnore, kIgnore, kIgnore, kIgnore}, at::kLong)));
  EXPECT_TRUE(at::equal(b.inputs[1], at::tensor({9, 10, 11, 12}, at::kLong)));
  EXPECT_TRUE(
      at::equal(b.targets[1], at::tensor({int64_t{10}, kIgnore, kIgnore, kIgnore}, at::kLong)));
  const auto stats = ds->packing();
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->packing, data::Packing::kNone);
  EXPECT_EQ(stats->tokens, 24);
  EXPECT_EQ(stats->targets, ds->target_count(all_windows(*ds)));
}

TEST(TokenDocuments, TheValidationSplitIsPackedAsTheTrainingOne) {
  test::TempDir dir;
  write_chat_shard(dir.path() + "/train_000000", make_docs({7, 7, 7, 7}));
  write_chat_shard(dir.path() + "/val_000000", make_docs({5, 9}, 500));
  data::DataOptions o;
  o.path = dir.path();
  o.context = 16;
  o.vocab_size = 1000;
  auto ds = data::make_token_dataset(o);
  EXPECT_EQ(ds->size(), 2);  // 7 + 7 per window
  const auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 1);  // 5 + 9
  expect_packed_batch_matches_documents(val->get(at::tensor({0}, at::kLong)),
                                        make_docs({5, 9}, 500), 16);
  // Two opens agree (the windows are a function of the files and the config alone).
  auto again = data::make_token_dataset(o);
  const auto idx = all_windows(*ds);
  EXPECT_TRUE(at::equal(ds->get(idx).inputs, again->get(idx).inputs));
}

TEST(TokenDocuments, DocumentPackingWithoutBoundariesIsRefusedNamingTheKey) {
  test::TempDir dir;
  write_chat_shard(dir.path() + "/train", make_docs({50}), /*mask=*/true, /*boundaries=*/false);
  const std::string shard = dir.path() + "/train.bin";
  EXPECT_THAT(
      error_of([&] { data::TokenShardDataset ds({shard}, 8, 100, {}, data::Packing::kDocuments); }),
      HasSubstr("data.packing: documents, but " + shard + " has no document boundaries"));
  data::TokenShardDataset ds({shard}, 8, 100);  // auto: none
  EXPECT_EQ(ds.packing_mode(), data::Packing::kNone);
  write_chat_shard(dir.path() + "/train", make_docs({50}));
  EXPECT_THAT(
      error_of([&] { data::TokenShardDataset d({shard}, 1, 100, {}, data::Packing::kDocuments); }),
      HasSubstr("data.packing: documents needs data.context >= 2"));
}

// A sidecar is there when anything but a directory has its name. A FIFO is refused naming it, at
// once: opening one for reading waits for a writer, so a reader that did so would hang the run.
// A directory in a mask's place is no mask: the shard trains without one.
TEST(TokenDocuments, ASidecarThatIsNoRegularFileIsRefusedAndNeverWaitedOn) {
  test::TempDir dir;
  const std::string base = dir.path() + "/train", shard = base + ".bin", mask = base + ".mask";
  write_chat_shard(base, make_docs({6, 4}));
  ASSERT_EQ(::unlink(mask.c_str()), 0);
  ASSERT_EQ(::mkfifo(mask.c_str(), 0600), 0);
  auto opened = std::async(std::launch::async, [&] {
    return error_of([&] { data::TokenShardDataset ds({shard}, 4, 100); });
  });
  if (opened.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "opening the shard waits on its FIFO mask " << mask;
    const int fd = ::open(mask.c_str(), O_WRONLY | O_NONBLOCK);  // the reader may go on
    if (fd >= 0) ::close(fd);
  }
  EXPECT_THAT(opened.get(), HasSubstr(mask + ": not a regular file"));
  ASSERT_EQ(::unlink(mask.c_str()), 0);
  ASSERT_EQ(::mkdir(mask.c_str(), 0700), 0);
  EXPECT_NO_THROW(data::TokenShardDataset({shard}, 4, 100));
  ::rmdir(mask.c_str());
}

TEST(TokenDocuments, MalformedMasksAndBoundariesAreNamedWithTheirOffsets) {
  test::TempDir dir;
  const std::string base = dir.path() + "/train", shard = base + ".bin", mask = base + ".mask",
                    docs = base + ".docs";
  auto open = [&] { data::TokenShardDataset ds({shard}, 4, 100); };
  auto reset = [&] { write_chat_shard(base, make_docs({6, 4})); };  // 10 tokens, 2 documents
  reset();
  EXPECT_NO_THROW(open());
  std::string offsets;
  for (const uint64_t v : {0, 6, 10}) append(offsets, v);

  // Mask and tokens of different lengths.
  write_bytes(mask, header("TRAINMSK", 9) + std::string(9, '\1'));
  EXPECT_THAT(error_of(open), HasSubstr(mask + ": the header (byte offset 16) says 9 tokens"));
  EXPECT_THAT(error_of(open), HasSubstr(shard + " holds 10 tokens"));
  write_bytes(mask, header("TRAINMSK", 10) + std::string(9, '\1'));  // truncated
  EXPECT_THAT(error_of(open), HasSubstr("says 10 tokens and 9 bytes follow it"));
  // A mask byte other than 0 or 1: the 8th token's, at 32 + 7.
  write_bytes(mask, header("TRAINMSK", 10) + std::string(7, '\0') + "\2" + std::string(2, '\1'));
  EXPECT_THAT(error_of(open), HasSubstr(mask + ": byte offset 39: mask value 2"));
  write_bytes(mask, header("TRAINMSX", 10) + std::string(10, '\1'));
  EXPECT_THAT(error_of(open), HasSubstr(mask + ": byte offset 0: not a loss mask file"));
  write_bytes(mask, header("TRAINMSK", 10, 2) + std::string(10, '\1'));
  EXPECT_THAT(error_of(open), HasSubstr(mask + ": byte offset 8: loss mask file version 2"));
  write_bytes(mask, "TRAINMSK");
  EXPECT_THAT(error_of(open), HasSubstr(mask + ": truncated: the loss mask header is 32 bytes"));
  reset();

  auto boundaries = [&](std::initializer_list<uint64_t> values, uint64_t count) {
    std::string body;
    for (const uint64_t v : values) append(body, v);
    write_bytes(docs, header("TRAINDOC", count) + body);
  };
  boundaries({0, 6, 11}, 2);  // past the end: the third boundary, at 32 + 16
  EXPECT_THAT(error_of(open), HasSubstr(docs +
                                        ": byte offset 48: boundary 11 is past the end of "
                                        "its token shard " +
                                        shard + " (10 tokens)"));
  boundaries({0, 6, 6, 10}, 3);
  EXPECT_THAT(error_of(open),
              HasSubstr(docs + ": byte offset 48: boundary 6 is not above the one before (6)"));
  boundaries({1, 6, 10}, 2);
  EXPECT_THAT(error_of(open), HasSubstr(docs + ": byte offset 32: boundary 1 is the first"));
  boundaries({0, 6, 9}, 2);
  EXPECT_THAT(error_of(open),
              HasSubstr(docs + ": byte offset 48: boundary 9 is the last, which must be the end"));
  boundaries({0, 6, 10}, 3);  // the header's count disagrees with the file's size
  EXPECT_THAT(error_of(open), HasSubstr(docs + ": the header (byte offset 16) says 3 documents"));
  boundaries({}, 0);
  EXPECT_THAT(error_of(open), HasSubstr("says 0 documents"));
  reset();

  // One shard of a split with a mask, the next without.
  write_chat_shard(dir.path() + "/train2", make_docs({8}), /*mask=*/false, /*boundaries=*/true);
  const std::string second = dir.path() + "/train2.bin";
  EXPECT_THAT(error_of([&] {
                data::TokenShardDataset ds({shard, second}, 4, 100);
              }),
              HasSubstr(second + ": no loss mask beside it (" + dir.path() + "/train2.mask), but " +
                        shard + " has them"));
}

TEST(TokenDocuments, ToDeviceCarriesThePositions) {
  data::Batch b{at::arange(12).view({3, 4}), at::arange(12).view({3, 4}),
                at::arange(12).view({3, 4}) % 4};
  const auto micro = data::to_device(b, 1, 2, c10::Device(c10::kCPU));
  ASSERT_TRUE(micro.positions.defined());
  EXPECT_TRUE(at::equal(micro.positions, b.positions.narrow(0, 1, 2)));
  const auto plain =
      data::to_device(data::Batch{b.inputs, b.targets, {}}, 0, 1, c10::Device(c10::kCPU));
  EXPECT_FALSE(plain.positions.defined());
}

}  // namespace TRAINER_UNITY_ID
