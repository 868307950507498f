# cmake -DSRC=<seed dir> -DDST=<corpus dir> -DARTIFACTS=<crash dir> -P copy_seeds.cmake
# Copies every file under SRC into DST and makes the crash directory (libFuzzer needs it).
file(MAKE_DIRECTORY ${DST} ${ARTIFACTS})
file(GLOB seeds ${SRC}/*)
foreach(s ${seeds})
  file(COPY ${s} DESTINATION ${DST})
endforeach()
