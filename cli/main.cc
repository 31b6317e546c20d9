// The `oom` command line tool. All logic lives in oom_cli (cli/cli.h) where tests reach it.
#include <iostream>

#include "cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  oom::cli::start_process_services(args);
  return oom::cli::run(args, {std::cout, std::cerr});
}
