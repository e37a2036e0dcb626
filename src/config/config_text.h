// config_text.h — the configuration as text: --help (every flag of config.h's table with its
// default) and the effective configuration at the start of a run's log.
#pragma once
#include "src/config/config.h"

#include <sstream>
#include <string>

// --help text: every flag of the table with its default.
std::string help_text(const std::string& program);

// The effective configuration, one "name value" per line, for the start of a run's log.
std::string config_summary(const TrainConfig& cfg);
