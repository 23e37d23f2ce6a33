# Third-party libraries, all from Debian packages installed by scripts/setup.sh (versions pinned there).
# Header-only forms are used so that binaries built here run on a GPU machine without these packages.
find_package(nlohmann_json 3.11 REQUIRED)
find_package(CLI11 2.1 REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(Threads REQUIRED)
if(FP4MOE_TESTS)
  find_package(GTest 1.12 REQUIRED)
  find_package(Python3 3.9 REQUIRED COMPONENTS Interpreter)
endif()
