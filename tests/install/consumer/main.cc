// Prints a model's total parameters through the installed costmodel library.
#include <iostream>

#include "costmodel/model_spec.h"
#include "costmodel/params.h"
#include "costmodel/version.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const oom::ModelSpec m = oom::load_model_spec(argv[1]);
  std::cout << argv[1] << ": " << oom::model_params(m).total() << " parameters (oom " << oom::oom_version_text() << ")\n";
  return 0;
}
