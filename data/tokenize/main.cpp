// tokenize — text or JSON-lines files -> GPT-2 or Llama 3 token shards (llm.c formats), and back.
// Run `tokenize --help` for the interface. Work is split into ~1 MiB items that worker
// threads encode independently; results are written strictly in input order, so the output
// does not depend on the thread count.
#include "encodings.h"
#include "shards.h"
#include "src/base/same_file.h"
#include "staged_output.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage: tokenize [options] FILE...        encode FILEs into token shards
       tokenize --decode [--tokenizer FILE] SHARD...   print the text of shards

Encodes text with GPT-2's byte-level BPE, giving the same ids as tiktoken's "gpt2"
encoding, into llm.c token shards: a 1024-byte header (20240520, 1, token count) then
uint16 tokens. Every document is preceded by the end-of-text token 50256.
With --encoding llama3: Llama 3's BPE (the ids of Meta's tokenizer), into llm.c's Llama 3
shards: header (20240801, 7, token count) then uint32 tokens; every document is preceded
by <|begin_of_text|> 128000.

Input (FILE "-" is standard input):
  --format text|jsonl    text: each FILE is one document (default)
                         jsonl: each line of each FILE is a JSON object; the string under
                         --jsonl-key is one document (blank lines are skipped)
  --jsonl-key KEY        key of the document text in jsonl lines (default: text)
  Any bytes are accepted: invalid UTF-8 is encoded byte by byte and decodes back to the
  same bytes. Special tokens' text ("<|endoftext|>", ...) inside a document is ordinary text.
  --encoding gpt2|llama3 the vocabulary (default: gpt2)

Output:
  --out-dir DIR          directory for the shards, created if missing (default: .)
  --name PREFIX          shard names: DIR/PREFIX_val_000000.bin, DIR/PREFIX_train_000000.bin, ...
                         (default: tokens); shards left from an earlier run with the same
                         PREFIX and higher numbers are removed
  Every file is written under a temporary name (NAME.tmp) and renamed into place only once
  the whole dataset is complete: a failed or interrupted run (an error, a full disk, SIGINT,
  SIGTERM) leaves --out-dir as it was, an earlier dataset of the same PREFIX included. An
  input that is one of the files a run writes or removes is refused before anything is read.
  --val-tokens N         the first N tokens go to the validation shard(s) (default: 0)
  --shard-tokens N       tokens per shard, at most 2147483647 (default: 100000000)
  Also writes DIR/gpt2_tokenizer.bin (llama3: DIR/llama3_tokenizer.bin), llm.c's tokenizer
  file, for decoding samples.
  --print-ids            write no files: print each document's ids (without 50256 or 128000)
                         as one line of space-separated numbers on standard output

Other:
  --threads N            encoding threads (default: number of CPUs)
  --bpe-dir DIR          directory with encoder.json and vocab.bpe (llama3: tokenizer.model),
                         checked by sha256 (default: data/gpt2_bpe, llama3: data/llama3_bpe,
                         beside this program; scripts/install_deps.sh fetches them)
  --quiet                no progress or summary on standard error
  --decode               FILEs are shards of either encoding (the header says which): write
                         the bytes of their tokens to standard output (special tokens as
                         their text, e.g. "<|endoftext|>"), checking each shard's header
  --tokenizer FILE       tokenizer file for --decode (default: gpt2_tokenizer.bin or
                         llama3_tokenizer.bin, by the shard's format, beside each shard)
  -h, --help             this text
)";

// Target size of one unit of work: ~2 ms of encoding, far above the cost of a thread
// hand-off, and small enough that even a single large document keeps every thread busy.
constexpr size_t kItemBytes = 64 << 10;

struct Options {
  std::string out_dir = ".";
  std::string name = "tokens";
  bool jsonl = false;
  std::string jsonl_key = "text";
  int64_t shard_tokens = 100000000;
  int64_t val_tokens = 0;
  int threads = 0;
  const Encoding* encoding = &kEncodings[0];
  bool encoding_given = false;
  std::string bpe_dir;
  std::string tokenizer_file;
  bool decode = false;
  bool print_ids = false;
  bool quiet = false;
  std::vector<std::string> files;
};

[[noreturn]] void usage_error(const std::string& message) {
  throw std::runtime_error(message + " (see tokenize --help)");
}

int64_t parse_count(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  bool digits = !text.empty() && text.size() <= 18 &&
                text.find_first_not_of("0123456789") == std::string::npos;
  int64_t value = digits ? std::stoll(text) : -1;
  if (!digits || value < min || value > max)
    usage_error(flag + " expects a whole number in " + std::to_string(min) + ".." +
                std::to_string(max) + ", got \"" + text + "\"");
  return value;
}

std::string default_bpe_dir(const Encoding& encoding) {
  std::error_code error;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) return (exe.parent_path() / "data" / encoding.vocab_dir).string();
  return std::string("data/") + encoding.vocab_dir;
}

Options parse_options(int argc, char** argv) {
  Options options;
  bool only_files = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (only_files || arg == "-" || arg[0] != '-') {
      options.files.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_files = true;
      continue;
    }
    std::string flag = arg, value;
    bool has_inline_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_inline_value = true;
    }
    auto next_value = [&]() {
      if (has_inline_value) return value;
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return std::string(argv[++i]);
    };
    auto no_value = [&]() {
      if (has_inline_value) usage_error(flag + " takes no value");
    };
    if (flag == "--help" || flag == "-h") {
      no_value();
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (flag == "--out-dir") {
      options.out_dir = next_value();
    } else if (flag == "--name") {
      options.name = next_value();
      if (options.name.empty() || options.name.find('/') != std::string::npos)
        usage_error("--name expects a file name prefix without '/', got \"" + options.name + "\"");
    } else if (flag == "--format") {
      std::string format = next_value();
      if (format != "text" && format != "jsonl")
        usage_error("--format expects text or jsonl, got \"" + format + "\"");
      options.jsonl = format == "jsonl";
    } else if (flag == "--jsonl-key") {
      options.jsonl_key = next_value();
    } else if (flag == "--shard-tokens") {
      options.shard_tokens = parse_count(flag, next_value(), 1, kMaxShardTokens);
    } else if (flag == "--val-tokens") {
      options.val_tokens = parse_count(flag, next_value(), 0, int64_t(1) << 50);
    } else if (flag == "--threads") {
      options.threads = static_cast<int>(parse_count(flag, next_value(), 1, 1024));
    } else if (flag == "--encoding") {
      std::string name = next_value();
      auto found = std::find_if(std::begin(kEncodings), std::end(kEncodings),
                                [&](const Encoding& encoding) { return name == encoding.name; });
      if (found == std::end(kEncodings))
        usage_error("--encoding expects gpt2 or llama3, got \"" + name + "\"");
      options.encoding = found;
      options.encoding_given = true;
    } else if (flag == "--bpe-dir") {
      options.bpe_dir = next_value();
    } else if (flag == "--tokenizer") {
      options.tokenizer_file = next_value();
    } else if (flag == "--decode") {
      no_value();
      options.decode = true;
    } else if (flag == "--print-ids") {
      no_value();
      options.print_ids = true;
    } else if (flag == "--quiet") {
      no_value();
      options.quiet = true;
    } else {
      usage_error("unknown option " + flag);
    }
  }
  if (options.files.empty()) usage_error(options.decode ? "no SHARD given" : "no FILE given");
  if (options.decode && options.print_ids) usage_error("--decode and --print-ids exclude each other");
  if (options.decode && options.encoding_given)
    usage_error("--encoding does not apply to --decode (each shard's header says its encoding)");
  if (std::count(options.files.begin(), options.files.end(), "-") > 1)
    usage_error("standard input (-) given more than once");
  if (options.threads == 0) options.threads = std::max(1u, std::thread::hardware_concurrency());
  if (options.bpe_dir.empty()) options.bpe_dir = default_bpe_dir(*options.encoding);
  return options;
}

// ---- decoding

int run_decode(const Options& options) {
  std::map<std::string, std::vector<std::string>> tokenizers;  // by file, loaded once each
  for (const auto& shard : options.files) {
    auto [format, tokens] = read_shard(shard);
    std::string tokenizer_path = options.tokenizer_file;
    if (tokenizer_path.empty()) {
      auto written_by = std::find_if(std::begin(kEncodings), std::end(kEncodings), [&](const Encoding& encoding) {
        return encoding.shards.magic == format.magic;
      });
      tokenizer_path = (std::filesystem::path(shard).parent_path() / written_by->tokenizer_file).string();
    }
    auto& vocab = tokenizers[tokenizer_path];
    if (vocab.empty()) vocab = read_tokenizer_file(tokenizer_path);
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= vocab.size())
        throw std::runtime_error(shard + ": token " + std::to_string(i) + " is " +
                                 std::to_string(tokens[i]) + ", outside the vocabulary of " +
                                 tokenizer_path);
      text += vocab[tokens[i]];
    }
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
      throw std::runtime_error(std::string("cannot write standard output: ") + std::strerror(errno));
  }
  if (std::fflush(stdout) != 0)
    throw std::runtime_error(std::string("cannot write standard output: ") + std::strerror(errno));
  return 0;
}

// ---- encoding pipeline: one reader thread -> worker threads -> this thread writes in order

struct WorkItem {
  std::string data;
  size_t file = 0;            // index into Options::files, for messages
  bool starts_document = false;  // text: first item of a file
  uint64_t first_line = 0;    // jsonl: line number of the first line in data
  std::string error;          // the reader failed: report this when the item's turn comes
};

struct WorkResult {
  std::vector<uint32_t> tokens;
  size_t input_bytes = 0;
  uint64_t documents = 0;
  std::string error;
};

class Pipeline {
 public:
  Pipeline(const Options& options, const ByteBpe& bpe) : options_(options), bpe_(bpe) {}

  // Runs everything; `consume` is called for each result in input order on this thread and
  // may throw to stop the run.
  template <typename Consume>
  void run(Consume consume);

 private:
  void read_all();
  void read_file(size_t index);
  void submit(WorkItem item);
  void work();
  WorkResult process(const WorkItem& item, PieceEncoder& encoder) const;

  const Options& options_;
  const ByteBpe& bpe_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<uint64_t, WorkItem>> pending_;
  std::map<uint64_t, WorkResult> done_;
  uint64_t submitted_ = 0, consumed_ = 0;
  bool reading_done_ = false, stopping_ = false;
};

template <typename Consume>
void Pipeline::run(Consume consume) {
  std::vector<std::thread> threads;
  threads.emplace_back([this] { read_all(); });
  for (int i = 0; i < options_.threads; ++i) threads.emplace_back([this] { work(); });
  auto stop_and_join = [&] {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& thread : threads) thread.join();
  };
  try {
    while (true) {
      WorkResult result;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return done_.count(consumed_) || (reading_done_ && consumed_ == submitted_); });
        if (!done_.count(consumed_)) break;
        result = std::move(done_[consumed_]);
        done_.erase(consumed_++);
      }
      changed_.notify_all();  // the reader may be waiting for room
      if (!result.error.empty()) throw std::runtime_error(result.error);
      consume(result);
    }
  } catch (...) {
    stop_and_join();
    throw;
  }
  stop_and_join();
}

void Pipeline::submit(WorkItem item) {
  std::unique_lock lock(mutex_);
  // Bounded look-ahead keeps memory flat on inputs of any size.
  size_t max_in_flight = 2 * size_t(options_.threads) + 2;
  changed_.wait(lock, [&] { return stopping_ || submitted_ - consumed_ < max_in_flight; });
  if (stopping_) return;
  pending_.emplace_back(submitted_++, std::move(item));
  changed_.notify_all();
}

void Pipeline::read_all() {
  for (size_t i = 0; i < options_.files.size(); ++i) {
    read_file(i);
    std::lock_guard lock(mutex_);
    if (stopping_) break;
  }
  {
    std::lock_guard lock(mutex_);
    reading_done_ = true;
  }
  changed_.notify_all();
}

// Last cut after a newline at or after `from` (0 if none): jsonl items hold whole lines.
size_t last_line_cut(const std::string& text, size_t from) {
  size_t newline = text.rfind('\n');
  return newline == std::string::npos || newline + 1 < from ? 0 : newline + 1;
}

void Pipeline::read_file(size_t index) {
  const std::string& path = options_.files[index];
  bool is_stdin = path == "-";
  const std::string name = is_stdin ? "standard input" : path;
  int fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    submit({"", index, false, 0, "cannot open " + name + ": " + std::strerror(errno)});
    return;
  }
  std::string buffer;
  size_t unsearched = 0;  // cuts before this offset were already looked for
  bool first_item = true;
  uint64_t next_line = 1;
  bool at_end = false;
  while (!at_end) {
    size_t old_size = buffer.size();
    buffer.resize(old_size + kItemBytes);
    ssize_t got = ::read(fd, buffer.data() + old_size, kItemBytes);
    buffer.resize(old_size + size_t(std::max<ssize_t>(got, 0)));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      submit({"", index, false, 0, "cannot read " + name + ": " + std::strerror(errno)});
      break;
    }
    at_end = got == 0;
    if (!at_end && buffer.size() < kItemBytes) continue;
    size_t cut = at_end ? buffer.size()
                 : options_.jsonl ? last_line_cut(buffer, unsearched)
                                  : bpe_.last_safe_cut(buffer, unsearched);
    // A text file always yields at least one item, so an empty file is an empty document.
    bool empty_document = at_end && first_item && !options_.jsonl;
    if (cut == 0 && !empty_document) {  // no cut in this stretch: read on
      unsearched = buffer.size();
      continue;
    }
    WorkItem item{buffer.substr(0, cut), index, first_item, next_line, ""};
    if (options_.jsonl) next_line += uint64_t(std::count(item.data.begin(), item.data.end(), '\n'));
    buffer.erase(0, cut);
    unsearched = 0;
    first_item = false;
    submit(std::move(item));
    std::lock_guard lock(mutex_);
    if (stopping_) break;
  }
  if (!is_stdin) ::close(fd);
}

void Pipeline::work() {
  PieceEncoder encoder(bpe_);
  while (true) {
    std::pair<uint64_t, WorkItem> job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !pending_.empty() || reading_done_; });
      if (stopping_ || pending_.empty()) return;
      job = std::move(pending_.front());
      pending_.pop_front();
    }
    WorkResult result;
    try {
      result = process(job.second, encoder);
    } catch (const std::exception& error) {  // reported in input order, like any error
      result.error = error.what();
    }
    {
      std::lock_guard lock(mutex_);
      done_[job.first] = std::move(result);
    }
    changed_.notify_all();
  }
}

WorkResult Pipeline::process(const WorkItem& item, PieceEncoder& encoder) const {
  WorkResult result;
  result.input_bytes = item.data.size();
  if (!item.error.empty()) {
    result.error = item.error;
    return result;
  }
  result.tokens.reserve(item.data.size() / 3);
  if (!options_.jsonl) {
    if (item.starts_document) {
      result.tokens.push_back(options_.encoding->document_start);
      result.documents = 1;
    }
    encoder.encode(item.data, result.tokens);
    return result;
  }
  std::string file = options_.files[item.file] == "-" ? "standard input" : options_.files[item.file];
  uint64_t line_number = item.first_line;
  for (size_t start = 0; start < item.data.size(); ++line_number) {
    size_t end = item.data.find('\n', start);
    if (end == std::string::npos) end = item.data.size();
    std::string_view line(item.data.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto where = [&] { return file + ":" + std::to_string(line_number) + ": "; };
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      result.error = where() + "invalid JSON (" + error.what() + ")";
      return result;
    }
    auto text = object.is_object() ? object.find(options_.jsonl_key) : object.end();
    if (!object.is_object() || text == object.end() || !text->is_string()) {
      result.error = where() + "expected a JSON object with a string under \"" + options_.jsonl_key + "\"";
      return result;
    }
    result.tokens.push_back(options_.encoding->document_start);
    ++result.documents;
    encoder.encode(text->get_ref<const std::string&>(), result.tokens);
  }
  return result;
}

// ---- progress and summary on standard error

class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}

  void add(const WorkResult& result) {
    bytes_ += result.input_bytes;
    tokens_ += result.tokens.size();
    documents_ += result.documents;
    if (quiet_) return;
    double now = seconds();
    // Updates every second on a terminal; every 30 s into a log, so long runs show life.
    if (now - last_shown_ < (tty_ ? 1.0 : 30.0)) return;
    last_shown_ = now;
    std::fprintf(stderr, "%stokenize: %.1f MB, %llu documents, %llu tokens, %.1f MB/s%s",
                 tty_ ? "\r" : "", bytes_ / 1e6, documents_, tokens_, bytes_ / 1e6 / now,
                 tty_ ? "   " : "\n");
    shown_ = true;
  }

  void finish(const std::string& outcome) const {
    if (quiet_) return;
    if (shown_ && tty_) std::fputc('\n', stderr);
    double elapsed = seconds();
    std::fprintf(stderr, "tokenize: %.2f MB, %llu documents -> %llu tokens in %.2f s (%.1f MB/s)%s\n",
                 bytes_ / 1e6, documents_, tokens_, elapsed, bytes_ / 1e6 / std::max(elapsed, 1e-9),
                 outcome.c_str());
  }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  bool quiet_, tty_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_shown_ = 0;
  size_t bytes_ = 0;
  unsigned long long tokens_ = 0, documents_ = 0;
};

// ---- entry points

void check_inputs(const Options& options) {
  for (const auto& path : options.files) {
    if (path == "-") continue;
    struct stat info;
    if (::stat(path.c_str(), &info) != 0)
      throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    if (S_ISDIR(info.st_mode)) throw std::runtime_error(path + " is a directory, expected a file");
    if (::access(path.c_str(), R_OK) != 0)
      throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  }
}

bool is_shard_suffix(const std::string& suffix) {  // "val_000000.bin" or "train_000000.bin"
  size_t digits = suffix.rfind("val_", 0) == 0 ? 4 : suffix.rfind("train_", 0) == 0 ? 6 : 0;
  return digits > 0 && suffix.size() == digits + 10 && suffix.compare(digits + 6, 4, ".bin") == 0 &&
         suffix.find_first_not_of("0123456789", digits) == digits + 6;
}

// Whether FILE (a name in --out-dir) is one an encoding run may write, replace or remove: a shard
// of this --name, this --encoding's tokenizer file, or the temporary name either is written under.
bool is_output_name(const Options& options, std::string file) {
  const std::string temp = ".tmp";
  if (file.size() > temp.size() && file.compare(file.size() - temp.size(), temp.size(), temp) == 0)
    file.resize(file.size() - temp.size());
  return file == options.encoding->tokenizer_file ||
         (file.rfind(options.name + "_", 0) == 0 && is_shard_suffix(file.substr(options.name.size() + 1)));
}

// An input that is one of the files the run writes or removes would be destroyed before (or
// while) it is read: refused, comparing files (device and inode), not names.
void check_inputs_are_not_outputs(const Options& options) {
  std::error_code error;
  if (!std::filesystem::is_directory(options.out_dir, error)) return;
  for (const auto& entry : std::filesystem::directory_iterator(options.out_dir, error)) {
    const std::string file = entry.path().filename().string();
    if (!is_output_name(options, file)) continue;
    const std::string what_run_does =
        file == options.encoding->tokenizer_file
            ? "writes"
            : "writes or removes (--out-dir " + options.out_dir + ", --name " + options.name + ")";
    for (const auto& input : options.files) {
      const std::string spelled = input == "-" ? "/dev/stdin" : input;
      if (same_file(spelled, entry.path().string()))
        throw std::runtime_error((input == "-" ? std::string("standard input") : input) + " is " +
                                 entry.path().string() + ", which this run " + what_run_does +
                                 ": copy it elsewhere, or choose another --out-dir or --name");
    }
  }
}

int run_print_ids(const Options& options, const ByteBpe& bpe) {
  Pipeline pipeline(options, bpe);
  bool in_document = false, document_empty = true;  // a document's ids may span results
  std::string text;
  pipeline.run([&](const WorkResult& result) {
    text.clear();
    for (uint32_t token : result.tokens) {
      if (token == options.encoding->document_start) {
        if (in_document) text += '\n';
        in_document = true;
        document_empty = true;
        continue;
      }
      if (!document_empty) text += ' ';
      text += std::to_string(token);
      document_empty = false;
    }
    std::fputs(text.c_str(), stdout);
  });
  if (in_document) std::fputc('\n', stdout);
  if (std::fflush(stdout) != 0)
    throw std::runtime_error(std::string("cannot write standard output: ") + std::strerror(errno));
  return 0;
}

// Earlier runs may have produced more shards under this prefix; left in place, a trainer that
// globs PREFIX_train_*.bin would mix them in.
int remove_stale_shards(const Options& options, const std::vector<std::string>& written) {
  int removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.out_dir)) {
    std::string file = entry.path().filename().string();
    if (file.rfind(options.name + "_", 0) != 0 || !is_shard_suffix(file.substr(options.name.size() + 1)))
      continue;
    if (std::find(written.begin(), written.end(), entry.path().string()) != written.end()) continue;
    std::filesystem::remove(entry.path());
    ++removed;
  }
  return removed;
}

int run_encode(const Options& options, const ByteBpe& bpe) {
  std::error_code error;
  std::filesystem::create_directories(options.out_dir, error);
  if (error) throw std::runtime_error("cannot create " + options.out_dir + ": " + error.message());
  const Encoding& encoding = *options.encoding;
  StagedOutput output;  // before the pipeline's threads: they inherit its blocked signals
  ShardWriter writer(output, options.out_dir, options.name, encoding.shards, options.val_tokens,
                     options.shard_tokens);
  Progress progress(options.quiet);
  Pipeline pipeline(options, bpe);
  pipeline.run([&](const WorkResult& result) {
    writer.write(result.tokens.data(), result.tokens.size());
    progress.add(result);
  });
  const std::vector<std::string> written = writer.finish();
  write_tokenizer_file(output.create(options.out_dir + "/" + encoding.tokenizer_file), bpe.token_bytes(),
                       static_cast<int>(encoding.end_of_text));
  output.publish();
  int removed = remove_stale_shards(options, written);
  std::string prefix = options.out_dir + "/" + options.name;
  std::string outcome = "\n  " + prefix + "_val_*.bin: " + std::to_string(writer.val_tokens_written()) +
                        " tokens in " + std::to_string(writer.val_shards()) + " shard(s); " + prefix +
                        "_train_*.bin: " + std::to_string(writer.train_tokens_written()) + " tokens in " +
                        std::to_string(writer.train_shards()) + " shard(s)";
  if (removed > 0) outcome += "; removed " + std::to_string(removed) + " older shard(s)";
  progress.finish(outcome);
  if (writer.val_tokens_written() < options.val_tokens && !options.quiet)
    std::fprintf(stderr, "tokenize: warning: --val-tokens %lld is more than all %lld tokens: no training shard\n",
                 static_cast<long long>(options.val_tokens), static_cast<long long>(writer.val_tokens_written()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse_options(argc, argv);
    if (options.decode) return run_decode(options);
    check_inputs(options);
    if (!options.print_ids) check_inputs_are_not_outputs(options);
    std::unique_ptr<ByteBpe> bpe = options.encoding->load(options.bpe_dir);
    return options.print_ids ? run_print_ids(options, *bpe) : run_encode(options, *bpe);
  } catch (const std::exception& error) {
    std::fflush(stdout);
    std::fprintf(stderr, "tokenize: %s\n", error.what());
    return 1;
  }
}
