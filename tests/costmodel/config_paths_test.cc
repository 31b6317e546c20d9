// config_root: $OOM_CONFIG_DIR naming no folder is an error naming the variable and its value,
// not an empty catalogue (every name unknown, every list empty).
#include "costmodel/config_paths.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigPaths, AConfigDirThatIsNoFolderIsAnError) {
  const char* was = std::getenv("OOM_CONFIG_DIR");
  const std::string saved = was != nullptr ? was : "";
  ::setenv("OOM_CONFIG_DIR", "/nonexistent-oom-configs", 1);
  EXPECT_EQ(error_of([] { config_names("models"); }),
            "field 'OOM_CONFIG_DIR': value \"/nonexistent-oom-configs\": no such folder (the environment variable names the configs "
            "folder, which holds models/ and hardware/)");
  ::setenv("OOM_CONFIG_DIR", "/dev/null", 1);  // there, but not a folder
  EXPECT_NE(error_of([] { config_root(); }).find("OOM_CONFIG_DIR"), std::string::npos);
  if (was != nullptr) {
    ::setenv("OOM_CONFIG_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("OOM_CONFIG_DIR");
  }
  EXPECT_FALSE(config_names("models").empty());
}

}  // namespace
}  // namespace oom
