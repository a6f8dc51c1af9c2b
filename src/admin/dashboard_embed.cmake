# dashboard_embed.cmake — turns src/admin/dashboard.html into a C source file.
#
# Run as a script at build time (cmake -DIN=... -DOUT=... -P this file) by the
# custom command in CMakeLists.txt, so the page is rebuilt into the binary
# whenever the HTML changes. Reads the file as hex with file(READ ... HEX),
# so no xxd or other tool is needed, and writes an unsigned char array
# initialiser, 16 bytes a line, with a terminating NUL that the length leaves
# out.
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "dashboard_embed.cmake: pass -DIN=page.html -DOUT=file.c")
endif()

file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
if(len EQUAL 0)
  message(FATAL_ERROR "dashboard_embed.cmake: ${IN} is empty")
endif()

# "3c68..." -> "0x3c,0x68,..." with a line break every 16 bytes.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# (CMake's regular expressions have no {n}: the group is spelt out 16 times.)
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line_re)
string(REGEX REPLACE "(${line_re})" "\\1\n\t" bytes "${bytes}")

file(WRITE "${OUT}.tmp"
  "/* Generated from src/admin/dashboard.html by src/admin/dashboard_embed.cmake: do not edit. */\n"
  "#include \"dashboard.h\"\n\n"
  "const unsigned char dashboard_html[] = {\n\t${bytes}0x00\n};\n"
  "const size_t dashboard_html_len = ${len};\n")
# Only touch the output when it changed, so an unchanged page recompiles nothing.
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
