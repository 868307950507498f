#!/bin/sh
# check_exports.sh LIB HEADER - libkiln.so exports exactly the functions kiln.h declares with
# KILN_API (test_api_exports): no internal symbol leaks, none of the API is missing.
lib="$1"; hdr="$2"
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not installed"; exit 77; }
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort -u > "${TMPDIR:-/tmp}/kiln-exports.$$"
sed -n 's/^KILN_API[^(]*[ *]\(kiln_[a-z0-9_]*\)(.*/\1/p' "$hdr" | sort -u > "${TMPDIR:-/tmp}/kiln-api.$$"
rc=0
extra=$(comm -23 "${TMPDIR:-/tmp}/kiln-exports.$$" "${TMPDIR:-/tmp}/kiln-api.$$")
missing=$(comm -13 "${TMPDIR:-/tmp}/kiln-exports.$$" "${TMPDIR:-/tmp}/kiln-api.$$")
if [ -n "$extra" ]; then echo "exported but not in kiln.h:"; echo "$extra" | head -20; rc=1; fi
if [ -n "$missing" ]; then echo "in kiln.h but not exported:"; echo "$missing"; rc=1; fi
n=$(wc -l < "${TMPDIR:-/tmp}/kiln-api.$$")
rm -f "${TMPDIR:-/tmp}/kiln-exports.$$" "${TMPDIR:-/tmp}/kiln-api.$$"
[ "$n" -ge 10 ] || { echo "only $n KILN_API functions found in $hdr"; rc=1; }
[ $rc = 0 ] && echo "ok: $n functions exported, nothing else"
exit $rc
