// config_text.cpp — --help and the start-up summary of every flag
#include "src/config/config_text.h"

#include "src/config/config.h"

#include <sstream>
#include <string>

std::string help_text(const std::string& program) {
  const TrainConfig defaults;
  std::ostringstream s;
  s << "usage: " << program << " [--flag value | --flag=value]...\n"
    << "Pretrains a GPT-2 or Llama 3 model on llm.c token shards. Every flag can also be set in a JSON file given to --config.\n"
    << "A 0|1 flag given without a value means 1 (--eval is --eval 1).\n\n";
  for (const Flag& f : flag_table()) {
    std::string lhs = std::string("  --") + f.name + " " + f.metavar;
    s << lhs << std::string(lhs.size() < 32 ? 32 - lhs.size() : 1, ' ') << f.help << "\n";
    std::string def = f.default_text ? f.default_text : config_detail::value_text(defaults, f);
    s << std::string(32, ' ') << "default: " << (def.empty() ? "none" : def) << "\n";
  }
  s << "  --help                        this text\n";
  return s.str();
}

std::string config_summary(const TrainConfig& cfg) {
  std::ostringstream s;
  for (const Flag& f : flag_table()) {
    std::string value = config_detail::value_text(cfg, f);
    if (value.empty()) value = "-";
    if (std::string(f.name) == "model" && !cfg.init_from.empty()) value = "- (architecture from --init-from)";
    s << "  " << f.name << std::string(std::string(f.name).size() < 20 ? 20 - std::string(f.name).size() : 1, ' ')
      << value << (cfg.was_set(f.name) ? "" : "  (default)") << "\n";
  }
  return s.str();
}
