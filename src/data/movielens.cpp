#include "data/movielens.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <string_view>
#include <unordered_map>

namespace data {
namespace {

template <class... Args>
MovieLensError error(const std::string& file, int64_t line, fmt::format_string<Args...> what,
                     Args&&... args) {
  return MovieLensError(
      fmt::format("{}:{}: {}", file, line, fmt::format(what, std::forward<Args>(args)...)));
}

std::vector<std::string_view> split(std::string_view line, std::string_view sep) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (size_t at = line.find(sep); at != std::string_view::npos; at = line.find(sep, start)) {
    fields.push_back(line.substr(start, at - start));
    start = at + sep.size();
  }
  fields.push_back(line.substr(start));
  return fields;
}

int64_t parse_int(std::string_view field, const char* what, const std::string& file, int64_t line) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
  if (ec != std::errc() || end != field.data() + field.size()) {
    throw error(file, line, "{} '{}' is not an integer", what, field);
  }
  return v;
}

// Calls fn(line, line_number) for each line that is not blank, without its line ending.
template <class Fn>
void for_each_line(const std::string& path, Fn&& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw MovieLensError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    fn(std::string_view(line), number);
  }
  if (in.bad()) throw MovieLensError(fmt::format("{}: read error after line {}", path, number));
}

bool is_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xe  ? 3
                     : (c >> 3) == 0x1e ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

// ML-1M's movies.dat is ISO-8859-1; the text encoder reads UTF-8 bytes.
std::string to_utf8(std::string_view s) {
  if (is_utf8(s)) return std::string(s);
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out.push_back(ch);
    } else {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

// SplitMix64's finaliser: a bijection on 64 bits whose outputs look independent.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Movie {
  int64_t id;
  std::string text;
};

struct Rating {
  int64_t user_id;
  int64_t item;  // dense
  int64_t timestamp;
};

const at::TensorOptions kInt64 = at::TensorOptions().dtype(at::kLong);

at::Tensor pairs_tensor(const std::vector<int64_t>& flat) {
  const auto n = static_cast<int64_t>(flat.size() / 2);
  return at::tensor(at::ArrayRef<int64_t>(flat), kInt64).view({n, 2});
}

void check_arguments(int64_t text_len, int64_t negatives_per_interaction) {
  if (text_len < 1) {
    throw std::invalid_argument(fmt::format("movielens: text_len must be >= 1, got {}", text_len));
  }
  if (negatives_per_interaction < 1) {
    throw std::invalid_argument(fmt::format(
        "movielens: negatives per interaction must be >= 1, got {}", negatives_per_interaction));
  }
}

// The movies of movies.dat, in ascending id order.
std::vector<Movie> read_movies(const std::string& path) {
  std::vector<Movie> movies;
  std::unordered_map<int64_t, int64_t> movie_line;
  for_each_line(path, [&](std::string_view line, int64_t n) {
    const auto f = split(line, "::");
    if (f.size() != 3) {
      throw error(path, n, "expected 3 fields MovieID::Title::Genres, got {}", f.size());
    }
    const int64_t id = parse_int(f[0], "MovieID", path, n);
    if (const auto [it, added] = movie_line.emplace(id, n); !added) {
      throw error(path, n, "duplicate MovieID {} (first listed at line {})", id, it->second);
    }
    movies.push_back({id, to_utf8(f[1]) + " | " + std::string(f[2])});
  });
  if (movies.size() < 2) {
    throw MovieLensError(fmt::format("{}: lists {} movie(s); negative sampling needs at least 2",
                                     path, movies.size()));
  }
  std::sort(movies.begin(), movies.end(),
            [](const Movie& a, const Movie& b) { return a.id < b.id; });
  return movies;
}

// The ratings of ratings.dat, in file order, with each MovieID mapped to its item by `item_of`.
std::vector<Rating> read_ratings(const std::string& path, const std::string& movies_path,
                                 const std::unordered_map<int64_t, int64_t>& item_of) {
  std::vector<Rating> ratings;
  for_each_line(path, [&](std::string_view line, int64_t n) {
    const auto f = split(line, "::");
    if (f.size() != 4) {
      throw error(path, n, "expected 4 fields UserID::MovieID::Rating::Timestamp, got {}",
                  f.size());
    }
    const int64_t user = parse_int(f[0], "UserID", path, n);
    const int64_t movie = parse_int(f[1], "MovieID", path, n);
    parse_int(f[2], "Rating", path, n);
    const int64_t timestamp = parse_int(f[3], "Timestamp", path, n);
    const auto it = item_of.find(movie);
    if (it == item_of.end()) {
      throw error(path, n, "unknown MovieID {} (not listed in {})", movie, movies_path);
    }
    ratings.push_back({user, it->second, timestamp});
  });
  if (ratings.empty()) throw MovieLensError(fmt::format("{}: holds no ratings", path));
  return ratings;
}

// The UserIDs that rate something, ascending.
std::vector<int64_t> rating_users(const std::vector<Rating>& ratings) {
  std::vector<int64_t> ids;
  for (const auto& r : ratings) ids.push_back(r.user_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The leave-last-out split (see movielens.h): the training interactions (users[i], items[i]) in
// ratings.dat order, and the held-out (user, item) pairs, flat, by user.
struct LeaveLastOut {
  std::vector<int64_t> users;
  std::vector<int64_t> items;
  std::vector<int64_t> held;
};

LeaveLastOut leave_last_out(const std::vector<Rating>& ratings,
                            const std::vector<int64_t>& user_ids) {
  std::unordered_map<int64_t, int64_t> user_of;
  for (size_t u = 0; u < user_ids.size(); ++u) user_of.emplace(user_ids[u], int64_t(u));
  // `>=` makes the later line win a timestamp tie.
  std::vector<int64_t> latest(user_ids.size(), -1);
  std::vector<int64_t> count(user_ids.size(), 0);
  for (size_t i = 0; i < ratings.size(); ++i) {
    const int64_t u = user_of.at(ratings[i].user_id);
    ++count[u];
    if (latest[u] < 0 || ratings[i].timestamp >= ratings[latest[u]].timestamp)
      latest[u] = int64_t(i);
  }
  LeaveLastOut out;
  for (size_t i = 0; i < ratings.size(); ++i) {
    const int64_t u = user_of.at(ratings[i].user_id);
    if (count[u] >= 2 && latest[u] == int64_t(i)) continue;
    out.users.push_back(u);
    out.items.push_back(ratings[i].item);
  }
  for (size_t u = 0; u < user_ids.size(); ++u) {
    if (count[u] < 2) continue;
    out.held.push_back(int64_t(u));
    out.held.push_back(ratings[latest[u]].item);
  }
  return out;
}

// int64 [movies, text_len]: each movie's text bytes, cut to text_len, padded with kTextPadId.
at::Tensor item_texts(const std::vector<Movie>& movies, int64_t text_len) {
  const auto n_items = static_cast<int64_t>(movies.size());
  at::Tensor item_text = at::full({n_items, text_len}, core::kTextPadId, kInt64);
  auto text = item_text.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n_items; ++i) {
    const std::string& s = movies[i].text;
    const int64_t n = std::min<int64_t>(text_len, static_cast<int64_t>(s.size()));
    for (int64_t k = 0; k < n; ++k) text[i][k] = static_cast<unsigned char>(s[k]);
  }
  return item_text;
}

std::string path_from(const DataOptions& o) {
  if (o.path.empty()) {
    throw MovieLensError(
        "data.path is empty: set it to a directory holding ratings.dat and movies.dat");
  }
  return o.path;
}

}  // namespace

MovieLensDataset::MovieLensDataset(const DataOptions& o)
    : MovieLensDataset(path_from(o), o.text_len, o.seed, o.negatives) {}

MovieLensDataset::MovieLensDataset(const std::string& dir, int64_t text_len, uint64_t seed,
                                   int64_t negatives_per_interaction)
    : seed_(seed), negatives_per_interaction_(negatives_per_interaction) {
  check_arguments(text_len, negatives_per_interaction);
  const std::string slash = dir.empty() || dir.back() == '/' ? "" : "/";
  const std::string movies_path = dir + slash + "movies.dat";
  const std::string ratings_path = dir + slash + "ratings.dat";

  const std::vector<Movie> movies = read_movies(movies_path);
  std::unordered_map<int64_t, int64_t> item_of;
  for (const auto& m : movies) {
    item_of.emplace(m.id, static_cast<int64_t>(movie_ids_.size()));
    movie_ids_.push_back(m.id);
  }
  const std::vector<Rating> ratings = read_ratings(ratings_path, movies_path, item_of);
  user_ids_ = rating_users(ratings);

  const LeaveLastOut parts = leave_last_out(ratings, user_ids_);
  train_users_ = at::tensor(at::ArrayRef<int64_t>(parts.users), kInt64);
  train_items_ = at::tensor(at::ArrayRef<int64_t>(parts.items), kInt64);
  held_out_ = pairs_tensor(parts.held);
  item_text_ = item_texts(movies, text_len);
}

int64_t MovieLensDataset::negative(int64_t index, int64_t positive) const {
  // Uniform over the num_items - 1 other items: draw from [0, n - 1), then step over the positive.
  const uint64_t h = mix(mix(seed_) ^ static_cast<uint64_t>(index));
  const auto others = static_cast<uint64_t>(num_items() - 1);
  const auto r = static_cast<int64_t>((static_cast<unsigned __int128>(h) * others) >> 64);
  return r >= positive ? r + 1 : r;
}

core::Shape MovieLensDataset::shape() const {
  core::Shape s;
  s.input_dim = 3;
  s.num_users = num_users();
  s.num_items = num_items();
  s.item_text = item_text_;
  return s;
}

Batch MovieLensDataset::get(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous().reshape({-1});
  const int64_t n = idx.size(0);
  at::Tensor inputs = at::empty({n, 3}, kInt64);
  auto out = inputs.accessor<int64_t, 2>();
  const auto* index = idx.data_ptr<int64_t>();
  const auto* users = train_users_.data_ptr<int64_t>();
  const auto* items = train_items_.data_ptr<int64_t>();
  const int64_t interactions = num_interactions();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = index[k];
    if (i < 0 || i >= size()) {
      throw std::out_of_range(
          fmt::format("movielens: sample index {} is outside [0, {})", i, size()));
    }
    const int64_t j = i % interactions;
    out[k][0] = users[j];
    out[k][1] = items[j];
    out[k][2] = negative(i, items[j]);
  }
  return {inputs, at::zeros({n}, kInt64)};
}

at::Tensor MovieLensDataset::train_interactions() const {
  return at::stack({train_users_, train_items_}, 1);
}

std::optional<RankingTask> MovieLensDataset::ranking_task() const {
  return RankingTask{held_out_, train_interactions(), num_users(), num_items()};
}

}  // namespace data
