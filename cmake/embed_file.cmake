# Writes the bytes of a file as a C array, for programs that carry a file inside them
# (src/server/http/status_page.html). Run as a script, at build time:
#   cmake -DIN=<file> -DOUT=<file.c> -DNAME=<symbol> -DHEADER=<header.h> -P embed_file.cmake
# OUT defines `const unsigned char NAME[]` (the bytes and a NUL) and `const size_t NAME_len`,
# and includes HEADER, which declares them. An array of bytes, not a string literal: nothing
# needs escaping, and no length limit of string literals applies.
foreach(var IN ITEMS IN OUT NAME HEADER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_file.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR len "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# Sixteen bytes per line.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " bytes "${bytes}")
get_filename_component(in_name "${IN}" NAME)
file(WRITE "${OUT}"
  "/* Generated from ${in_name} by cmake/embed_file.cmake: do not edit. */\n"
  "#include \"${HEADER}\"\n\n"
  "const unsigned char ${NAME}[] = {\n    ${bytes}0x00};\n"
  "const size_t ${NAME}_len = ${len};\n")
