# cmake -DSRC=<templates dir> -DDST=<corpus dir> -DARTIFACTS=<crash dir> -P copy_corpus.cmake
# Copies every *.jinja under SRC into DST (created if needed). A missing SRC leaves an
# empty corpus, and the fuzzer starts from scratch.
file(MAKE_DIRECTORY ${DST} ${ARTIFACTS})
file(GLOB seeds ${SRC}/*.jinja)
list(LENGTH seeds n)
foreach(s ${seeds})
  file(COPY ${s} DESTINATION ${DST})
endforeach()
message(STATUS "fuzz_template corpus: ${n} seed template(s) from ${SRC}")
