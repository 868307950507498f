#!/bin/sh
# run.sh - the ctest entry of the npm clients' end-to-end suite (test_server_e2e): openai,
# @anthropic-ai/sdk, the Vercel AI SDK, LangChain JS, and the chat page in chromium
# (playwright-core).
# Skips (exit 77) when node, an installed client (npm ci here) or the model is missing; the
# chat page's browser tests skip by themselves, with a message, when chromium is missing.
# Environment (set by tests/server/CMakeLists.txt): KILN_BIN, KILN_SHARED_DIR, KILN_SANITIZE.
cd "$(dirname "$0")" || exit 1
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed"; exit 77
fi
for pkg in openai @anthropic-ai/sdk ai @ai-sdk/openai @langchain/openai playwright-core zod; do
  if [ ! -f "node_modules/$pkg/package.json" ]; then
    echo "SKIP: the npm client $pkg is not installed (run 'npm ci' in tests/server/e2e)"; exit 77
  fi
done
model="${KILN_SHARED_DIR:-../../../../shared}/models/stories260K/stories260K-f32.gguf"
if [ ! -r "$model" ]; then
  echo "SKIP: model $model is missing"; exit 77
fi
export KILN_MODEL="$model"
exec node --test --test-concurrency=1 openai.test.mjs msgapi.test.mjs load.test.mjs tools.test.mjs \
  clients.test.mjs page.test.mjs
