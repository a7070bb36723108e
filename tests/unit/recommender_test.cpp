// The recommender: cached and uncached modes agree, uncache() releases the cache, the frozen text
// encoder stays out of the parameters and gradients, the registry builds it from a MovieLens
// dataset, a few hundred Adam steps bring the BPR loss clearly down, and the loss and every
// gradient match the PyTorch twin (tests/reference/recommender.py).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <map>
#include <set>
#include <string>

#include "common/temp_dir.h"
#include "data/movielens.h"
#include "io/safetensors.h"
#include "models/recommender.h"
#include "models/registry.h"
#include "reference_harness.h"

namespace TRAINER_UNITY_ID {

using models::Recommender;
using models::RecommenderOptions;
using ::testing::HasSubstr;

constexpr int64_t kUsers = 12;
constexpr int64_t kItems = 20;
constexpr int64_t kLen = 10;

RecommenderOptions small_options() {
  RecommenderOptions o;
  o.embedding_dim = 8;
  o.mlp_hidden = 16;
  o.mlp_depth = 1;
  o.encoder = {.dim = 16, .layers = 2, .heads = 2, .max_len = kLen, .out_dim = 6, .seed = 5};
  return o;
}

// Item i's text: "item <i>" and a genre word, padded to kLen.
at::Tensor item_texts(int64_t n, int64_t len = kLen) {
  at::Tensor t = at::full({n, len}, models::TextEncoder::kPadId, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const std::string s = (i % 2 ? "drama " : "war ") + std::to_string(i);
    for (size_t k = 0; k < s.size() && int64_t(k) < len; ++k) t[i][k] = int64_t(s[k]);
  }
  return t;
}

std::shared_ptr<Recommender> make(const RecommenderOptions& o = small_options()) {
  at::manual_seed(11);
  return std::make_shared<Recommender>(kUsers, kItems, item_texts(kItems), o);
}

// Runs the enclosing scope on one intra-op thread: for tensors this small it is faster, and it
// does not slow down 20x when OpenMP threads spin-wait on a loaded 2-core machine.
class OneThread {
 public:
  OneThread() { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(saved_); }

 private:
  int saved_ = at::get_num_threads();
};

// A batch of (user, positive, negative) with repeated items, and a few items absent.
at::Tensor batch() {
  return at::tensor({0, 1, 2, 3, 1, 4, 5, 4, 1, 11, 19, 0, 7, 2, 2}, at::kLong).view({5, 3});
}

at::Tensor buffer(Recommender& m, const std::string& name) { return *m.named_buffers().find(name); }

TEST(Recommender, CachedAndUncachedGiveTheSameLossAndGradients) {
  auto m = make();
  m->build_cache();
  ASSERT_TRUE(m->cache_built());
  const at::Tensor cached = m->loss(batch(), at::Tensor());
  cached.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : m->parameters()) grads.push_back(p.grad().clone());
  m->zero_grad();

  ASSERT_TRUE(m->uncache());
  const at::Tensor uncached = m->loss(batch(), at::Tensor());
  uncached.backward();
  EXPECT_NEAR(cached.item<double>(), uncached.item<double>(), 1e-6);
  const auto params = m->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::allclose(params[i].grad(), grads[i], 1e-5, 1e-6)) << i;
  }
  EXPECT_FALSE(m->cache_built());  // uncached mode does not build it behind one's back
}

TEST(Recommender, UncacheReleasesTheCacheOnce) {
  auto m = make();
  m->build_cache();
  EXPECT_EQ(buffer(*m, "item_cache").sizes(), (std::vector<int64_t>{kItems, 6}));
  EXPECT_TRUE(m->uncache());
  EXPECT_FALSE(m->cached());
  EXPECT_EQ(buffer(*m, "item_cache").numel(), 0);
  EXPECT_FALSE(m->uncache());
  // And back: build_cache() re-enters cached mode.
  m->build_cache();
  EXPECT_TRUE(m->cached());
  EXPECT_EQ(buffer(*m, "item_cache").size(0), kItems);
}

TEST(Recommender, CachedModeBuildsTheCacheOnFirstUse) {
  auto m = make();
  EXPECT_TRUE(m->cached());
  EXPECT_FALSE(m->cache_built());
  m->loss(batch(), at::Tensor());
  EXPECT_TRUE(m->cache_built());
}

TEST(Recommender, ModesAgreeWhenEncodingTakesSeveralChunks) {
  // More items than one encoder chunk (1024): the cache and score_all are built in pieces.
  const OneThread one_thread;
  constexpr int64_t kMany = 2100;
  at::manual_seed(11);
  Recommender m(kUsers, kMany, item_texts(kMany), small_options());
  const at::Tensor users = at::tensor({0, 5}, at::kLong);
  const at::Tensor inputs =
      at::tensor({0, 2099, 3, 5, 1024, 1023, 7, 0, 2048}, at::kLong).view({3, 3});
  const at::Tensor chunked = m.score_all(users);
  m.build_cache();
  const double cached = m.loss(inputs, at::Tensor()).item<double>();
  EXPECT_TRUE(at::allclose(m.score_all(users), chunked, 1e-5, 1e-6));
  m.uncache();
  EXPECT_NEAR(m.loss(inputs, at::Tensor()).item<double>(), cached, 1e-6);
  EXPECT_EQ(chunked.sizes(), (std::vector<int64_t>{2, kMany}));
}

TEST(Recommender, FrozenEncoderIsNotAParameterAndGetsNoGradient) {
  auto m = make();
  std::set<std::string> names;
  for (const auto& p : m->named_parameters()) names.insert(p.key());
  EXPECT_EQ(names, (std::set<std::string>{"user_embedding.weight", "item_embedding.weight",
                                          "tower.0.weight", "tower.0.bias", "tower.1.weight",
                                          "tower.1.bias"}));
  int64_t encoder_buffers = 0;
  for (const auto& b : m->named_buffers()) {
    EXPECT_FALSE(b.value().requires_grad()) << b.key();
    encoder_buffers += b.key().rfind("text_encoder.", 0) == 0;
  }
  EXPECT_EQ(encoder_buffers, int64_t(m->encoder().weights().size()));

  m->loss(batch(), at::Tensor()).backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
  for (const auto& b : m->named_buffers()) EXPECT_FALSE(b.value().grad().defined()) << b.key();
}

TEST(Recommender, LossIsBprOfTheScores) {
  auto m = make();
  const at::Tensor s = m->forward(batch());
  ASSERT_EQ(s.sizes(), (std::vector<int64_t>{5, 2}));
  const double expected = (1 + (s.select(1, 1) - s.select(1, 0)).exp()).log().mean().item<double>();
  EXPECT_NEAR(m->loss(batch(), at::Tensor()).item<double>(), expected, 1e-6);
}

TEST(Recommender, ScoreAllAgreesWithForwardInBothModes) {
  auto m = make();
  const at::Tensor users = at::tensor({3, 0, 11}, at::kLong);
  const at::Tensor uncached_first = m->score_all(users);  // cache not built: encodes in chunks
  EXPECT_FALSE(m->cache_built());
  m->build_cache();
  const at::Tensor all = m->score_all(users);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{3, kItems}));
  EXPECT_FALSE(all.requires_grad());
  EXPECT_TRUE(at::allclose(all, uncached_first, 1e-5, 1e-6));
  // Row of user 0 via forward: inputs (0, item_0 .. item_{n-1}).
  const at::Tensor row =
      at::cat({at::zeros({1}, at::kLong), at::arange(kItems, at::kLong)}).view({1, -1});
  EXPECT_TRUE(at::allclose(m->forward(row)[0], all[1], 1e-5, 1e-6));
}

TEST(Recommender, MetadataChangesScores) {
  // Same ids and seeds, different texts: scores differ, so the text reaches the item vectors.
  at::manual_seed(11);
  Recommender a(kUsers, kItems, item_texts(kItems), small_options());
  at::manual_seed(11);
  Recommender b(kUsers, kItems, item_texts(kItems).flip(0), small_options());
  EXPECT_FALSE(at::allclose(a.forward(batch()), b.forward(batch())));
}

TEST(Recommender, LoadsEncoderWeightsFromTheOptions) {
  const test::TempDir dir;
  const std::string path = dir.file("encoder.safetensors");
  RecommenderOptions o = small_options();
  models::TextEncoder other(
      {.dim = 16, .layers = 2, .heads = 2, .max_len = kLen, .out_dim = 6, .seed = 99});
  io::write_safetensors(path, other.weights());
  o.encoder_weights = path;
  auto m = make(o);
  EXPECT_TRUE(at::equal(m->encoder().weights().at("wte.weight"), other.weights().at("wte.weight")));
}

TEST(Recommender, RejectsInputsThatDoNotFit) {
  const auto o = small_options();
  EXPECT_THROW(Recommender(kUsers, kItems, item_texts(kItems - 1), o), std::invalid_argument);
  EXPECT_THROW(Recommender(kUsers, kItems, item_texts(kItems, kLen + 1), o), std::invalid_argument);
  EXPECT_THROW(Recommender(kUsers, kItems, item_texts(kItems).to(at::kInt), o),
               std::invalid_argument);
  EXPECT_THROW(Recommender(kUsers, kItems, item_texts(kItems) + 300, o), std::invalid_argument);
  EXPECT_THROW(Recommender(kUsers, kItems, at::Tensor(), o), std::invalid_argument);
  auto m = make();
  EXPECT_THROW(m->loss(batch().narrow(1, 0, 2), at::Tensor()), std::invalid_argument);
}

TEST(Recommender, TrainingBringsTheBprLossDown) {
  const OneThread one_thread;
  // Two groups: users 0-9 rate items 0-9, users 10-19 items 10-19 (texts "war"/"drama" differ by
  // group too); even users rate their group's even items, odd users the odd ones. Negatives come
  // from the other group.
  constexpr int64_t kU = 20, kI = 20;
  std::vector<int64_t> rows;
  for (int64_t u = 0; u < kU; ++u) {
    const int64_t g = u / 10;
    for (int64_t k = 0; k < 5; ++k) {
      rows.insert(rows.end(), {u, g * 10 + (u + 2 * k) % 10, (1 - g) * 10 + (u + 3 * k) % 10});
    }
  }
  const at::Tensor inputs = at::tensor(rows, at::kLong).view({-1, 3});
  at::Tensor text = at::full({kI, kLen}, models::TextEncoder::kPadId, at::kLong);
  for (int64_t i = 0; i < kI; ++i) {
    const std::string s = (i < 10 ? "war " : "drama ") + std::to_string(i);
    for (size_t k = 0; k < s.size(); ++k) text[i][k] = int64_t(s[k]);
  }
  at::manual_seed(0);
  Recommender m(kU, kI, text, small_options());
  m.build_cache();
  torch::optim::Adam adam(m.parameters(), torch::optim::AdamOptions(0.01));
  const double first = m.loss(inputs, at::Tensor()).item<double>();
  double last = first;
  for (int step = 0; step < 200; ++step) {
    adam.zero_grad();
    const at::Tensor loss = m.loss(inputs, at::Tensor());
    loss.backward();
    adam.step();
    last = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(2.0), 0.1);  // scores start near 0
  EXPECT_LT(last, 0.1 * first) << "first " << first << " last " << last;
  // And it generalises: items of the user's group it never rated outscore the other group's.
  const at::Tensor scores = m.score_all(at::arange(kU, at::kLong));
  int64_t users_ranked_right = 0;
  for (int64_t u = 0; u < kU; ++u) {
    const int64_t g = u / 10;
    const at::Tensor unseen = scores[u].narrow(0, g * 10 + (1 - u % 2), 9).slice(0, 0, 9, 2);
    const at::Tensor other = scores[u].narrow(0, (1 - g) * 10, 10);
    users_ranked_right += unseen.min().item<double>() > other.mean().item<double>();
  }
  EXPECT_GE(users_ranked_right, kU - 2);
}

// The PyTorch twin, written from the definitions in recommender.h and text_encoder.h: the BPR
// loss and every trainable gradient within 1e-4, the item metadata computed there from the
// encoder's weights and the texts (never from this model's cache). The encoder's weights are
// perturbed first: its LayerNorm weights of one and zero biases would hide a swapped weight and
// bias. A tower of depth 2 (three Linear layers); one run, as each starts a Python with torch.
TEST(RecommenderReference, LossAndEveryGradientMatchPyTorch) {
  RecommenderOptions o = small_options();
  o.mlp_depth = 2;
  auto m = make(o);
  std::map<std::string, at::Tensor> frozen;
  {
    at::NoGradGuard no_grad;
    for (const auto& b : m->named_buffers()) {
      if (b.key() == "item_cache") continue;  // the twin computes the metadata itself
      if (at::isFloatingType(b.value().scalar_type()))
        b.value().add_(at::randn_like(b.value()) * 0.05);
      frozen[b.key()] = b.value();
    }
  }
  m->build_cache();  // from the perturbed encoder
  const std::map<std::string, std::string> meta = {
      {"encoder_layers", std::to_string(o.encoder.layers)},
      {"encoder_heads", std::to_string(o.encoder.heads)},
      {"mlp_depth", std::to_string(o.mlp_depth)}};
  test::expect_matches_reference(*m, batch(), at::zeros({batch().size(0)}, at::kLong),
                                 "recommender.py", meta, 1e-4, frozen);
}

TEST(Recommender, RegistryBuildsItFromAMovieLensDataset) {
  const data::MovieLensDataset ds(std::string(TRAINER_SOURCE_DIR) + "/data/movielens-sample", 32,
                                  1);
  models::ModelOptions o;
  o.name = "recommender";
  o.hidden_dim = 32;
  o.depth = 1;
  o.embedding_dim = 16;
  o.encoder_dim = 32;
  o.encoder_layers = 1;
  o.encoder_heads = 2;
  core::Shape shape;
  shape.input_dim = ds.shape().input_dim;
  shape.num_users = ds.num_users();
  shape.num_items = ds.num_items();
  shape.item_text = ds.item_text();
  auto model = models::create_model(o, shape);
  ASSERT_TRUE(models::has_model("recommender"));
  auto* cache = models::as<models::EmbeddingCache>(*model);
  ASSERT_NE(cache, nullptr);
  cache->build_cache();
  const auto b = ds.get(at::arange(64, at::kLong));
  const double loss = model->loss(b.inputs, b.targets).item<double>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(2.0), 0.2);
  EXPECT_TRUE(cache->uncache());

  core::Shape no_text = shape;
  no_text.item_text = at::Tensor();
  try {
    models::create_model(o, no_text);
    FAIL() << "no error without item texts";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("item texts"));
  }
}

}  // namespace TRAINER_UNITY_ID
