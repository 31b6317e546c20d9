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

// The lookup order: $OOM_CONFIG_DIR, then the folder the program set (the Python package), then
// share/oom beside the program (none beside a test program), then the source tree, which
// OOM_NO_BUILD_TREE_FALLBACK=1 turns off: then nothing is found and that is one error.
TEST(ConfigPaths, LookupOrderAndTheBuildTreeFallback) {
  const char* was = std::getenv("OOM_CONFIG_DIR");
  const std::string saved = was != nullptr ? was : "";
  ::unsetenv("OOM_CONFIG_DIR");
  EXPECT_EQ(config_location().origin, DataOrigin::kBuildTree);
  EXPECT_EQ(config_root(), std::string(OOM_SOURCE_DIR) + "/configs");
  EXPECT_EQ(shipped_data_path("experiments/paper"), std::string(OOM_SOURCE_DIR) + "/experiments/paper");

  const std::string elsewhere = std::string(OOM_SOURCE_DIR) + "/tests";  // any folder; configs/ need not exist for the order
  set_program_data_root(elsewhere);
  EXPECT_EQ(shipped_data_root()->origin, DataOrigin::kProgram);
  EXPECT_EQ(config_root(), elsewhere + "/configs");
  set_program_data_root("");

  ::setenv("OOM_NO_BUILD_TREE_FALLBACK", "1", 1);
  EXPECT_FALSE(shipped_data_root().has_value());
  EXPECT_NE(error_of([] { config_root(); }).find("no configs folder found"), std::string::npos);
  EXPECT_NE(error_of([] { shipped_data_path("experiments/paper"); }).find("no shipped data folder"), std::string::npos);
  ::setenv("OOM_CONFIG_DIR", (std::string(OOM_SOURCE_DIR) + "/configs").c_str(), 1);
  EXPECT_EQ(config_location().origin, DataOrigin::kEnvironment);
  EXPECT_FALSE(config_names("models").empty());
  ::unsetenv("OOM_NO_BUILD_TREE_FALLBACK");
  if (was != nullptr) {
    ::setenv("OOM_CONFIG_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("OOM_CONFIG_DIR");
  }
}

}  // namespace
}  // namespace oom
