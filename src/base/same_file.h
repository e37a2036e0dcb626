// same_file.h — whether two paths name one file: the check that keeps a command's outputs off its
// inputs however a path is spelled (a symlink, a hard link, "a/../b", a relative path).
#pragma once
#include <string>

// True when both exist and are the same file or directory (same device and inode, after
// resolving symlinks); false when either does not exist.
bool same_file(const std::string& a, const std::string& b);
