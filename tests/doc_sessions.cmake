# The documentation's console sessions, run and checked against the output the pages show
# (tests/doc_sessions.py: `<!-- test: session -->` before a ```console block). include()d from
# tests/CMakeLists.txt, after the tools and the examples are defined.
#
# docs/tools.md runs the tools (ckpt, ckpt-run) on the checkpoints of two examples:
# fault_recover (which reads Debian's dataset-fashion-mnist) and heat_diffusion. Its sessions
# also use Debian's python3 with NumPy and PyTorch (python3-numpy, python3-torch) and gnuplot
# (gnuplot-nox), all of which scripts/deps.sh installs. About 4 s on 2 cores.
#
# Another page with sessions: add it to the command below, and the directories of the programs
# it runs as --path options.
if(TARGET ckpt-tool AND TARGET ckpt-run AND TARGET heat_diffusion AND TARGET fault_recover)
  add_test(NAME docs_tools_sessions
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/doc_sessions.py
                   --path $<TARGET_FILE_DIR:ckpt-tool>
                   --path $<TARGET_FILE_DIR:ckpt-run>
                   --path $<TARGET_FILE_DIR:heat_diffusion>
                   --path $<TARGET_FILE_DIR:fault_recover>
                   --timeout 60
                   ${PROJECT_SOURCE_DIR}/docs/tools.md)
  set_tests_properties(docs_tools_sessions PROPERTIES LABELS docs TIMEOUT 120)
endif()
