// staged_output.h — the files one encoding run writes (shards, tokenizer file), made to appear
// together or not at all: each is written under a temporary name (AtomicFileWriter,
// src/base/durable_file.h) and synced as it is complete; publish() renames them all into place
// once the whole dataset is. A failure (an exception) removes the temporary files; so does
// SIGINT, SIGTERM or SIGHUP, which end the command (status 128 + the signal's number) leaving
// the out-dir as it was.
#pragma once
#include "src/base/durable_file.h"

#include <memory>
#include <string>
#include <vector>

class StagedOutput {
 public:
  // Blocks the stop signals in this thread and every thread it starts later; the first
  // StagedOutput starts the thread that waits for them. Construct before starting any other thread.
  StagedOutput();
  // Files not published are removed.
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // A new file that will appear at PATH on publish().
  AtomicFileWriter& create(const std::string& path);
  // Renames every file into place, in the order created.
  void publish();

 private:
  std::vector<std::unique_ptr<AtomicFileWriter>> files_;
};
