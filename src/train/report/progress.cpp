#include "train/report/progress.h"

// barkeep formats its bar with fmt when asked (else std::format, which GCC 12 lacks); the fmt it
// gets is the system's, through the shim every layer has (trainer_settings, src/CMakeLists.txt;
// cmake/TrainerDeps.cmake).
#define BARKEEP_ENABLE_FMT_FORMAT 1
#include <barkeep/barkeep.h>
#include <fmt/format.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <ostream>
#include <streambuf>
#include <vector>

namespace train {
namespace {

constexpr double kRedrawS = 0.1;  // the bar's refresh interval (tqdm's default too)
constexpr double kWindowS = 1.0;  // samples/s on the bar: over the last window this long

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Progress::Shared {
  int64_t total = 0;
  std::atomic<int64_t> done{0};
  std::atomic<double> loss{std::numeric_limits<double>::quiet_NaN()};
  std::atomic<double> samples_per_s{0};     // 0: not measured yet
  std::atomic<double> seconds_per_step{0};  // steady, since this run's first step; 0: not yet
  std::atomic<int64_t> last_tick_ns{0};

  // Seconds left: the remaining steps at the steady pace, less the time since the last step
  // ended (so that the bar counts down between slow steps). Negative: not known yet.
  double eta_s(int64_t now) const {
    const double per_step = seconds_per_step.load(std::memory_order_relaxed);
    if (per_step <= 0) return -1;
    const int64_t remaining = total - done.load(std::memory_order_relaxed);
    if (remaining <= 0) return 0;
    const double since = (now - last_tick_ns.load(std::memory_order_relaxed)) * 1e-9;
    return std::max(1.0, remaining * per_step - since);
  }
};

namespace {

// Note [Log lines above the bar]
// barkeep's thread redraws the bar in place ("\r\033[K" and the bar) on stderr (bar_stream()),
// every 0.1 s; rank 0's spdlog lines go to stdout. On one terminal a line would land on the bar's
// line and the next redraw would wipe half of it. So while the bar is up, each sink of the default
// logger is wrapped (AboveBarSink): under one mutex with the bar's frames, it clears the bar's
// line, lets the real sink write and flush the line, and draws the last frame again below it. The
// lines scroll above the bar and the bar stays on the bottom line (tqdm.write does the same).
// The step lines stay: they are the run's history in the scroll-back. barkeep writes a frame in
// pieces and then flushes; FrameBuffer collects the pieces and hands over whole frames, so a line
// never lands inside a frame either. The sinks are swapped at the start and the end of the run,
// on the training thread, when nothing else logs (the loader's workers never do).
class Terminal {
 public:
  explicit Terminal(std::FILE* stream) : stream_(stream) {}

  // A frame from barkeep's thread: "\r\033[K" and the bar, or "\n" once the bar is done.
  void frame(const std::string& text) {
    std::lock_guard lock(mutex_);
    shown_ = text.back() == '\n' ? std::string() : fit(text);
    put(shown_.empty() ? text : shown_);
  }

  template <class Fn>
  void above(Fn&& write_line) {
    std::lock_guard lock(mutex_);
    if (!shown_.empty()) put("\r\033[K");
    write_line();
    if (!shown_.empty()) put(shown_);
  }

 private:
  void put(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stream_);
    std::fflush(stream_);
  }

  // The frame cut to the terminal's width: a frame that wraps would leave a line behind at every
  // redraw. Its characters are one column each (barkeep's Blocks style: ASCII and block glyphs,
  // no colours), so columns are UTF-8 code points after the "\r\033[K".
  std::string fit(const std::string& frame) const {
    winsize size{};
    if (ioctl(fileno(stream_), TIOCGWINSZ, &size) != 0 || size.ws_col < 2) return frame;
    const std::string clear = "\r\033[K";
    const size_t prefix = frame.starts_with(clear) ? clear.size() : 0;
    size_t columns = 0;
    for (size_t i = prefix; i < frame.size(); ++i) {
      const bool starts_character = (static_cast<unsigned char>(frame[i]) & 0xC0) != 0x80;
      // The last column stays free: writing there makes some terminals wrap early.
      if (starts_character && ++columns == size.ws_col) return frame.substr(0, i);
    }
    return frame;
  }

  std::FILE* const stream_;
  std::mutex mutex_;
  std::string shown_;  // the frame on the terminal's last line ("": none)
};

class FrameBuffer : public std::streambuf {
 public:
  explicit FrameBuffer(Terminal& terminal) : terminal_(terminal) {}

 protected:
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      pending_.push_back(traits_type::to_char_type(c));
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    pending_.append(s, static_cast<size_t>(n));
    return n;
  }
  int sync() override {
    if (!pending_.empty()) terminal_.frame(pending_);
    pending_.clear();
    return 0;
  }

 private:
  Terminal& terminal_;
  std::string pending_;
};

class AboveBarSink final : public spdlog::sinks::sink {
 public:
  AboveBarSink(spdlog::sink_ptr inner, Terminal& terminal)
      : inner_(std::move(inner)), terminal_(terminal) {}

  void log(const spdlog::details::log_msg& msg) override {
    if (!inner_->should_log(msg.level)) return;
    terminal_.above([&] {
      inner_->log(msg);
      inner_->flush();  // on the terminal before the bar comes back
    });
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  spdlog::sink_ptr inner_;
  Terminal& terminal_;
};

// The text right of the bar: "812 samples/s  loss 0.5123  eta 1m02s", each part once known.
class StatusText final : public barkeep::BaseDisplay {
 public:
  StatusText(std::ostream* out, std::shared_ptr<const Progress::Shared> shared)
      : BaseDisplay(out, barkeep::Duration{kRedrawS}), shared_(std::move(shared)) {}
  ~StatusText() override { done(); }

 protected:
  long render_(bool /*redraw*/, const std::string& end) override {
    const double rate = shared_->samples_per_s.load(std::memory_order_relaxed);
    const double loss = shared_->loss.load(std::memory_order_relaxed);
    const double eta = shared_->eta_s(now_ns());
    std::string text;
    if (rate > 0) text += fmt::format("{:.{}f} samples/s", rate, rate >= 100 ? 0 : 1);
    if (!std::isnan(loss)) text += fmt::format("{}loss {:.4f}", text.empty() ? "" : "  ", loss);
    text += fmt::format("{}eta {}", text.empty() ? "" : "  ", eta < 0 ? "?" : format_duration(eta));
    out() << text << end;
    return 0;  // lines: none
  }

 private:
  std::shared_ptr<const Progress::Shared> shared_;
};

// The stream the bar is drawn on: stderr, unless stdout is a terminal that stderr is not. Under
// mpirun a rank's stdout is a pty and its stderr a pipe, which mpirun forwards separately: a bar
// on stderr would be reordered against the lines on stdout. There (log.progress: bar) the bar
// takes the lines' stream.
std::FILE* bar_stream() {
  struct stat out {
  }, err{};
  if (isatty(STDOUT_FILENO) == 1 && fstat(STDOUT_FILENO, &out) == 0 &&
      fstat(STDERR_FILENO, &err) == 0 && (out.st_dev != err.st_dev || out.st_ino != err.st_ino)) {
    return stdout;
  }
  return stderr;
}

}  // namespace

struct Progress::Bar {
  Bar(const std::shared_ptr<Shared>& shared, int64_t total)
      : terminal(bar_stream()), buffer(terminal), out(&buffer) {
    // "120/600 |██████▍                       | ": the count right-aligned to the total's width,
    // so the bar does not shift as digits are added.
    const std::string format =
        fmt::format("{{value:>{}}}/{{total}} {{bar}}", fmt::format("{}", total).size());
    auto bar = barkeep::ProgressBar(
        &shared->done, barkeep::ProgressBarConfig<int64_t>{.out = &out,
                                                           .total = total,
                                                           .format = format,
                                                           .style = barkeep::Blocks,
                                                           .interval = kRedrawS,
                                                           .no_tty = false,  // drawn in place
                                                           .show = false});
    display = barkeep::Composite({bar, std::make_shared<StatusText>(&out, shared)}, "");
    logger = spdlog::default_logger();
    sinks = logger->sinks();
    for (auto& sink : logger->sinks()) sink = std::make_shared<AboveBarSink>(sink, terminal);
    display->show();
  }

  ~Bar() {
    display->done();  // the last frame and a newline, from barkeep's thread, which then ends
    logger->sinks() = sinks;
  }

  Terminal terminal;
  FrameBuffer buffer;
  std::ostream out;
  std::shared_ptr<barkeep::BaseDisplay> display;
  std::shared_ptr<spdlog::logger> logger;
  std::vector<spdlog::sink_ptr> sinks;  // the logger's own, put back at the end
};

ProgressMode progress_mode(ProgressSetting configured, int rank, bool stderr_is_terminal) {
  if (rank != 0) return ProgressMode::kOff;
  switch (configured) {
    case ProgressSetting::kOff: return ProgressMode::kOff;
    case ProgressSetting::kBar: return ProgressMode::kBar;
    case ProgressSetting::kLines: return ProgressMode::kLines;
    case ProgressSetting::kAuto: break;
  }
  return stderr_is_terminal ? ProgressMode::kBar : ProgressMode::kLines;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::ceil(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

Progress::Progress(ProgressMode mode, int64_t start_step, int64_t total_steps, int64_t global_batch)
    : mode_(mode), total_(total_steps), global_batch_(global_batch) {
  if (mode_ == ProgressMode::kOff) return;
  shared_ = std::make_shared<Shared>();
  shared_->total = total_steps;
  shared_->done.store(start_step);
  if (mode_ == ProgressMode::kBar) bar_ = std::make_unique<Bar>(shared_, total_steps);
}

Progress::~Progress() = default;

void Progress::tick(int64_t step) {
  if (mode_ == ProgressMode::kOff) return;
  const int64_t now = now_ns();
  Shared& s = *shared_;
  s.done.store(step, std::memory_order_relaxed);
  if (first_step_ < 0) {
    first_step_ = window_step_ = step;
    first_ns_ = window_ns_ = now;
  } else {
    s.seconds_per_step.store((now - first_ns_) * 1e-9 / static_cast<double>(step - first_step_),
                             std::memory_order_relaxed);
    // Until the first window closes, the average since the first step; then the last window's.
    const double window_s = (now - window_ns_) * 1e-9;
    if (window_s > 0 && (!window_closed_ || window_s >= kWindowS)) {
      s.samples_per_s.store(static_cast<double>((step - window_step_) * global_batch_) / window_s,
                            std::memory_order_relaxed);
    }
    if (window_s >= kWindowS) {
      window_step_ = step;
      window_ns_ = now;
      window_closed_ = true;
    }
  }
  s.last_tick_ns.store(now, std::memory_order_relaxed);
}

void Progress::set_loss(double loss) {
  if (mode_ == ProgressMode::kOff) return;
  shared_->loss.store(loss, std::memory_order_relaxed);
}

std::string Progress::eta_suffix() const {
  if (mode_ == ProgressMode::kOff) return "";
  // Right after tick(): no time since the last step to take off.
  const double eta = shared_->eta_s(shared_->last_tick_ns.load(std::memory_order_relaxed));
  return eta < 0 ? "" : " eta " + format_duration(eta);
}

}  // namespace train
