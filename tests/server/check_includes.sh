#!/bin/sh
# check_includes.sh SRC_DIR - the server reaches the engine and the model only through kiln.h
# (DESIGN.md "Layers"): every quoted #include under src/server names kiln.h, a server/ header
# or a util/ header (test_server_public_api_only).
dir="$1/src/server"
[ -d "$dir" ] || { echo "no $dir"; exit 1; }
bad=$(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$dir"/*.c "$dir"/*.h |
      grep -v -E '#[[:space:]]*include[[:space:]]*"(kiln\.h|server/[^"]*|util/[^"]*)"')
if [ -n "$bad" ]; then
  echo "src/server includes internal headers (use include/kiln.h):"
  echo "$bad"
  exit 1
fi
n=$(cat "$dir"/*.c "$dir"/*.h | grep -c '^[[:space:]]*#[[:space:]]*include[[:space:]]*"')
echo "ok: $n quoted includes under src/server, all kiln.h, server/ or util/"
