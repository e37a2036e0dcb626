// kernel_resources.h — the GPU build's registers and static shared memory per kernel, as ptxas
// reported them (make ptx-report's table), which simt checks launches against
// (kernel_resources.cpp; docs/SIMT.md, "Launches").
#pragma once
#include <string>

namespace simt {

// Adds the rows of a table in make ptx-report's .tsv layout — tab-separated: the kernel as c++filt
// prints it, architecture, registers per thread, spill stores, spill loads, static shared memory
// bytes, stack bytes — to the figures launches are checked against. A file that cannot be read, a
// row that cannot be parsed and an architecture simt knows no limits for stop the program: a
// table that silently checks nothing would be worse than none. The table SIMT_KERNEL_RESOURCES
// names is added before the first launch; tests add their own.
void load_kernel_resources(const std::string& path);

}  // namespace simt
