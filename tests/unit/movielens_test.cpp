// MovieLens files: parsing, dense ids, the leave-last-out split in closed form on a hand-written
// file, item texts, every kind of bad line (the message names file:line), and deterministic
// negatives that never equal the positive.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "common/temp_dir.h"
#include "data/movielens.h"
#include "data/registry.h"

namespace TRAINER_UNITY_ID {

using data::MovieLensDataset;
using data::MovieLensError;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kSample = std::string(TRAINER_SOURCE_DIR) + "/data/movielens-sample";

// Movies listed out of id order; ids with gaps.
const std::string kMovies = "30::Gamma (1999)::Drama\n"          // 1 -> item 2
                            "10::Alpha (1990)::Action|Comedy\n"  // 2 -> item 0
                            "20::Beta (1995)::Horror\n";         // 3 -> item 1
// Users 3 -> 0, 5 -> 1, 7 -> 2.
const std::string kRatings =
    "7::10::5::100\n"  // 1  user 2, item 0
    "3::20::4::50\n"   // 2  user 0, item 1
    "7::30::3::300\n"  // 3  user 2, item 2: user 2's latest -> held out
    "7::20::1::200\n"  // 4  user 2, item 1
    "5::30::2::10\n"   // 5  user 1, item 2: user 1's only rating -> training only
    "3::10::4::60\n"   // 6  user 0, item 0
    "3::30::4::60\n";  // 7  user 0, item 2: ties line 6, later in the file -> held out

class MovieLens : public ::testing::Test {
 protected:
  std::string write(const std::string& movies, const std::string& ratings) {
    std::ofstream(dir_.file("movies.dat"), std::ios::binary) << movies;
    std::ofstream(dir_.file("ratings.dat"), std::ios::binary) << ratings;
    return dir_.path();
  }
  std::string file(const char* name) const { return dir_.file(name); }

  // The message of the MovieLensError loading these files throws; a failure if none.
  std::string load_error(const std::string& movies, const std::string& ratings) {
    const std::string dir = write(movies, ratings);
    try {
      MovieLensDataset(dir, 16, 0);
    } catch (const MovieLensError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no MovieLensError";
    return "";
  }

  test::TempDir dir_;
};

std::vector<int64_t> flat(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::string text_of(const at::Tensor& row) {
  std::string s;
  for (int64_t b : flat(row)) {
    if (b != core::kTextPadId) s.push_back(static_cast<char>(b));
  }
  return s;
}

// The launcher maps std::invalid_argument (DataError) to exit code 2, a user mistake; any other
// exception is exit 1. A malformed MovieLens file is the user's data, so it must be a DataError.
TEST_F(MovieLens, MalformedFileIsADataErrorTheLauncherReportsAsAUserMistake) {
  const std::string dir = write("1::Toy Story (1995)::Animation\n2::Heat (1995)::Action\n",
                                "1::1::5::978300760\ngarbage\n");
  try {
    MovieLensDataset(dir, 16, 0);
    FAIL() << "no error for a malformed ratings.dat";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ratings.dat:2"), std::string::npos) << e.what();
    EXPECT_NE(dynamic_cast<const data::DataError*>(&e), nullptr) << e.what();
  }
}

TEST_F(MovieLens, LeaveLastOutInClosedForm) {
  const MovieLensDataset ds(write(kMovies, kRatings), 32, 0);
  EXPECT_EQ(ds.num_users(), 3);
  EXPECT_EQ(ds.num_items(), 3);
  EXPECT_THAT(ds.user_ids(), ElementsAre(3, 5, 7));
  EXPECT_THAT(ds.movie_ids(), ElementsAre(10, 20, 30));
  // Users 0 and 2 hold out item 2; user 1 has a single rating and no held-out row.
  EXPECT_THAT(flat(ds.held_out()), ElementsAre(0, 2, 2, 2));
  EXPECT_EQ(ds.held_out().sizes(), (std::vector<int64_t>{2, 2}));
  // Lines 1, 2, 4, 5, 6 in file order; 8 samples (negatives) per interaction by default.
  EXPECT_EQ(ds.num_interactions(), 5);
  EXPECT_EQ(ds.negatives_per_interaction(), 8);
  EXPECT_EQ(ds.size(), 40);
  EXPECT_THAT(flat(ds.train_interactions()), ElementsAre(2, 0, 0, 1, 2, 1, 1, 2, 0, 0));
  EXPECT_EQ(ds.shape().input_dim, 3);
  EXPECT_EQ(ds.shape().num_classes, 0);
  EXPECT_EQ(ds.shape().num_items, ds.num_items());
}

TEST_F(MovieLens, SamplesAreUserPositiveNegative) {
  const MovieLensDataset ds(write(kMovies, kRatings), 32, 0);
  const auto b = ds.get(at::tensor({4, 0, 2}, at::kLong));
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(b.inputs.scalar_type(), at::kLong);
  EXPECT_THAT(flat(b.inputs.narrow(1, 0, 2)), ElementsAre(0, 0, 2, 0, 2, 1));
  EXPECT_TRUE(at::equal(b.targets, at::zeros({3}, at::kLong)));
  EXPECT_THROW(ds.get(at::tensor({40}, at::kLong)), std::out_of_range);
  EXPECT_THROW(ds.get(at::tensor({-1}, at::kLong)), std::out_of_range);
}

TEST_F(MovieLens, ItemTextIsTitleAndGenresPadded) {
  const MovieLensDataset ds(write(kMovies, kRatings), 32, 0);
  EXPECT_EQ(ds.item_text().sizes(), (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(text_of(ds.item_text()[0]), "Alpha (1990) | Action|Comedy");
  EXPECT_EQ(text_of(ds.item_text()[2]), "Gamma (1999) | Drama");
  EXPECT_EQ(ds.item_text()[2][20].item<int64_t>(), core::kTextPadId);  // 20 bytes, then padding
  const MovieLensDataset cut(write(kMovies, kRatings), 8, 0);
  EXPECT_EQ(text_of(cut.item_text()[1]), "Beta (19");
}

TEST_F(MovieLens, Latin1TitlesBecomeUtf8) {
  const MovieLensDataset ds(
      write("1::Mis\xe9rables::Drama\n2::Caf\xc3\xa9::Comedy\n", "1::1::5::1\n"), 32, 0);
  EXPECT_EQ(text_of(ds.item_text()[0]), "Mis\xc3\xa9rables | Drama");
  EXPECT_EQ(text_of(ds.item_text()[1]), "Caf\xc3\xa9 | Comedy");  // already UTF-8: unchanged
}

TEST_F(MovieLens, BlankLinesAndCrlfAreAccepted) {
  const MovieLensDataset ds(
      write("1::A::Drama\r\n\r\n2::B::War\r\n", "1::1::5::1\r\n\n1::2::3::2\r\n"), 16, 0);
  EXPECT_EQ(ds.num_items(), 2);
  EXPECT_EQ(ds.num_interactions(), 1);
  EXPECT_EQ(text_of(ds.item_text()[1]), "B | War");
  // Line numbers count the blank lines.
  EXPECT_THAT(load_error("1::A::Drama\n\n2::B\n", "1::1::5::1\n"), HasSubstr("movies.dat:3:"));
}

TEST_F(MovieLens, BadMovieLinesNameFileAndLine) {
  const std::string ok = "1::1::5::1\n";
  const std::string movies = file("movies.dat");
  EXPECT_THAT(load_error("1::A::Drama\n2::B\n", ok),
              AllOf(HasSubstr(movies + ":2:"), HasSubstr("expected 3 fields"), HasSubstr("got 2")));
  EXPECT_THAT(load_error("1::A::Drama\n2::B::War::x\n", ok),
              AllOf(HasSubstr(movies + ":2:"), HasSubstr("got 4")));
  EXPECT_THAT(load_error("1::A::Drama\nx2::B::War\n", ok),
              AllOf(HasSubstr(movies + ":2:"), HasSubstr("MovieID 'x2' is not an integer")));
  EXPECT_THAT(
      load_error("1::A::Drama\n2::B::War\n1::C::Horror\n", ok),
      AllOf(HasSubstr(movies + ":3:"), HasSubstr("duplicate MovieID 1"), HasSubstr("line 1")));
  EXPECT_THAT(load_error("1::A::Drama\n", ok), AllOf(HasSubstr(movies), HasSubstr("at least 2")));
}

TEST_F(MovieLens, BadRatingLinesNameFileAndLine) {
  const std::string m = "1::A::Drama\n2::B::War\n";
  const std::string ratings = file("ratings.dat");
  EXPECT_THAT(
      load_error(m, "1::1::5::1\n1::2::5\n"),
      AllOf(HasSubstr(ratings + ":2:"), HasSubstr("expected 4 fields"), HasSubstr("got 3")));
  EXPECT_THAT(load_error(m, "1::1::5::1\n1:2::5::1\n"),
              AllOf(HasSubstr(ratings + ":2:"), HasSubstr("got 3")));
  EXPECT_THAT(load_error(m, "u1::1::5::1\n"),
              AllOf(HasSubstr(ratings + ":1:"), HasSubstr("UserID 'u1' is not an integer")));
  EXPECT_THAT(load_error(m, "1::1::5::1\n1::2.5::5::1\n"),
              AllOf(HasSubstr(ratings + ":2:"), HasSubstr("MovieID '2.5' is not an integer")));
  EXPECT_THAT(load_error(m, "1::1::five::1\n"),
              AllOf(HasSubstr(ratings + ":1:"), HasSubstr("Rating 'five' is not an integer")));
  EXPECT_THAT(load_error(m, "1::1::5:: 1\n"),
              AllOf(HasSubstr(ratings + ":1:"), HasSubstr("Timestamp ' 1' is not an integer")));
  EXPECT_THAT(
      load_error(m, "1::1::5::1\n2::2::5::1\n3::9::5::1\n"),
      AllOf(HasSubstr(ratings + ":3:"), HasSubstr("unknown MovieID 9"), HasSubstr("movies.dat")));
  EXPECT_THAT(load_error(m, "\n"), AllOf(HasSubstr(ratings), HasSubstr("no ratings")));
}

TEST_F(MovieLens, MissingFilesAndPath) {
  try {
    MovieLensDataset(dir_.file("nowhere"), 16, 0);
    FAIL() << "no error";
  } catch (const MovieLensError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("nowhere/movies.dat"), HasSubstr("cannot open")));
  }
  data::DataOptions o;
  o.dataset = "movielens";
  try {
    data::make_dataset(o);
    FAIL() << "no error";
  } catch (const MovieLensError& e) {
    EXPECT_THAT(e.what(), HasSubstr("data.path"));
  }
  EXPECT_THROW(MovieLensDataset(write(kMovies, kRatings), 0, 0), std::invalid_argument);
}

TEST(MovieLensSample, ParsesAndSplits) {
  data::DataOptions o;
  o.dataset = "movielens";
  o.path = kSample;
  o.text_len = 48;
  o.negatives = 8;
  o.seed = 3;
  const auto ds = data::make_dataset(o);
  const auto& ml = dynamic_cast<const MovieLensDataset&>(*ds);
  EXPECT_EQ(ml.num_users(), 300);
  EXPECT_EQ(ml.num_items(), 300);
  EXPECT_EQ(ml.held_out().size(0), 300);  // every sample user has >= 10 ratings
  EXPECT_EQ(ml.num_interactions() + ml.held_out().size(0), 6048);
  EXPECT_EQ(ml.size(), 8 * ml.num_interactions());  // 8 negatives per interaction
  EXPECT_EQ(ml.item_text().sizes(), (std::vector<int64_t>{300, 48}));
  EXPECT_THAT(data::dataset_names(), ::testing::Contains("movielens"));
}

TEST(MovieLensSample, NegativesAreDeterministicUniformAndNeverThePositive) {
  const MovieLensDataset ds(kSample, 16, 42);
  const at::Tensor all = at::arange(ds.size(), at::kLong);
  const at::Tensor in = ds.get(all).inputs;
  const at::Tensor pos = in.select(1, 1), neg = in.select(1, 2);
  EXPECT_FALSE(neg.eq(pos).any().item<bool>());
  EXPECT_TRUE(neg.ge(0).all().item<bool>());
  EXPECT_TRUE(neg.lt(ds.num_items()).all().item<bool>());
  // Every item turns up as a negative (about 150 times each).
  const std::vector<int64_t> negatives = flat(neg);
  EXPECT_EQ(std::set<int64_t>(negatives.begin(), negatives.end()).size(), size_t(ds.num_items()));

  // The same index gives the same sample in any batch, order, or copy of the data set.
  EXPECT_TRUE(at::equal(ds.get(all).inputs, in));
  const at::Tensor some = at::tensor({17, 3, 17, 5000, 0}, at::kLong);
  EXPECT_TRUE(at::equal(ds.get(some).inputs, in.index_select(0, some)));
  const MovieLensDataset again(kSample, 16, 42);
  EXPECT_TRUE(at::equal(again.get(all).inputs, in));
  // Another seed, other negatives (same users and positives).
  const MovieLensDataset other(kSample, 16, 43);
  const at::Tensor in2 = other.get(all).inputs;
  EXPECT_TRUE(at::equal(in2.narrow(1, 0, 2), in.narrow(1, 0, 2)));
  EXPECT_GT(in2.select(1, 2).ne(neg).sum().item<int64_t>(), ds.size() / 2);
}

TEST(MovieLensSample, EachInteractionRepeatsWithFreshNegatives) {
  const MovieLensDataset ds(kSample, 16, 42, 3);
  const int64_t n = ds.num_interactions();
  ASSERT_EQ(ds.size(), 3 * n);
  const at::Tensor in = ds.get(at::arange(ds.size(), at::kLong)).inputs;
  // Sample i is interaction i mod n: copies k = 0, 1, 2 share (user, positive)...
  const at::Tensor pairs = ds.train_interactions();
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(at::equal(in.narrow(0, k * n, n).narrow(1, 0, 2), pairs)) << "copy " << k;
  }
  // ... with their own negatives (equal by chance about once in 299).
  const at::Tensor neg = in.select(1, 2);
  EXPECT_LT(neg.narrow(0, 0, n).eq(neg.narrow(0, n, n)).sum().item<int64_t>(), n / 50);
  EXPECT_LT(neg.narrow(0, n, n).eq(neg.narrow(0, 2 * n, n)).sum().item<int64_t>(), n / 50);
  // The negative is a function of (seed, index) alone: K does not change the first copy.
  const MovieLensDataset one(kSample, 16, 42, 1);
  EXPECT_EQ(one.size(), n);
  EXPECT_TRUE(at::equal(one.get(at::arange(n, at::kLong)).inputs, in.narrow(0, 0, n)));
  EXPECT_THROW(MovieLensDataset(kSample, 16, 42, 0), std::invalid_argument);
}

TEST_F(MovieLens, WithTwoItemsTheNegativeIsTheOtherItem) {
  const MovieLensDataset ds(
      write("1::A::Drama\n2::B::War\n", "1::1::5::1\n1::2::5::2\n1::1::5::3\n2::2::1::1\n"), 8, 9);
  const at::Tensor in = ds.get(at::arange(ds.size(), at::kLong)).inputs;
  EXPECT_TRUE(at::equal(in.select(1, 2), 1 - in.select(1, 1)));
}

}  // namespace TRAINER_UNITY_ID
