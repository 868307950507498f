# chat_page.cmake - turn chat_page.html into C (cmake -DIN=chat_page.html -DOUT=file.c -P ...).
# Writes srv_chat_page_html (the bytes, NUL-terminated) and srv_chat_page_csp: a
# Content-Security-Policy that lets only this page's own <style> and <script> elements apply,
# named by the base64 SHA-256 of their text (CSP Level 3, "hash-source"). Run at build time by
# src/CMakeLists.txt; needs nothing but CMake.

# base64 (RFC 4648) of the bytes written as hex digits in HEX.
function(hex_to_base64 hex out)
  set(abc "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${hex}" n)
  set(res "")
  set(i 0)
  while(i LESS n)
    math(EXPR left "${n} - ${i}")
    if(left GREATER_EQUAL 6)
      set(take 6)
    else()
      set(take ${left})
    endif()
    string(SUBSTRING "${hex}" ${i} ${take} chunk)
    # pad the group to 3 bytes
    set(pad "")
    if(take EQUAL 4)
      set(chunk "${chunk}00")
      set(pad "=")
    elseif(take EQUAL 2)
      set(chunk "${chunk}0000")
      set(pad "==")
    endif()
    math(EXPR v "0x${chunk}")
    set(group "")
    foreach(shift 18 12 6 0)
      math(EXPR k "(${v} >> ${shift}) & 63")
      string(SUBSTRING "${abc}" ${k} 1 c)
      string(APPEND group "${c}")
    endforeach()
    if(pad STREQUAL "=")
      string(SUBSTRING "${group}" 0 3 group)
    elseif(pad STREQUAL "==")
      string(SUBSTRING "${group}" 0 2 group)
    endif()
    string(APPEND res "${group}${pad}")
    math(EXPR i "${i} + ${take}")
  endwhile()
  set(${out} "${res}" PARENT_SCOPE)
endfunction()

# 'sha256-...' of the text between <TAG> and </TAG> (the page has one of each).
function(element_hash text tag out)
  string(FIND "${text}" "<${tag}>" a)
  string(FIND "${text}" "</${tag}>" b)
  string(FIND "${text}" "<${tag}>" last REVERSE)
  if(a EQUAL -1 OR b EQUAL -1 OR b LESS a OR NOT last EQUAL a)
    message(FATAL_ERROR "${IN}: the page must hold exactly one <${tag}>...</${tag}> element "
                        "(and no other '<${tag}>' text, even in a comment)")
  endif()
  string(LENGTH "<${tag}>" open)
  math(EXPR a "${a} + ${open}")
  math(EXPR len "${b} - ${a}")
  string(SUBSTRING "${text}" ${a} ${len} body)
  string(SHA256 hex "${body}")
  hex_to_base64("${hex}" b64)
  set(${out} "'sha256-${b64}'" PARENT_SCOPE)
endfunction()

file(READ "${IN}" page)
element_hash("${page}" style style_src)
element_hash("${page}" script script_src)
set(csp "default-src 'none'; script-src ${script_src}; style-src ${style_src}; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR nbytes "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
set(row "")
foreach(k RANGE 1 16)
  string(APPEND row "0x..,")
endforeach()
string(REGEX REPLACE "(${row})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUT}.tmp"
"/* Generated from src/server/chat_page.html by src/server/chat_page.cmake: do not edit. */\n"
"#include <stddef.h>\n"
"const unsigned char srv_chat_page_html[] = {\n    ${bytes}0x00};\n"
"const size_t srv_chat_page_html_len = ${nbytes};\n"
"const char srv_chat_page_csp_value[] = \"${csp}\";\n")
file(RENAME "${OUT}.tmp" "${OUT}")
