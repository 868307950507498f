# kiln - top-level convenience targets. See README.md.
#   make run    install missing Debian packages, build, run kiln on the default model
#   make test   same set-up, then the whole CTest suite: normal build, ASan+UBSan build,
#               and the libFuzzer targets for a bounded time each

MODEL  ?= ../shared/models/stories260K/stories260K-f32.gguf
PROMPT ?= Once upon a time
ARGS   ?= -n 128
JOBS   ?= $(shell nproc)
FUZZ_SECONDS ?= 30

DEB_PACKAGES := cmake make gcc clang libclang-rt-14-dev pkg-config libjansson-dev libpcre2-dev python3 binutils \
                libutf8proc-dev libxxhash-dev libmicrohttpd-dev python3-jsonschema

.PHONY: all deps e2e-deps build build-asan build-fuzz run test test-normal test-asan test-fuzz clean format

all: build

# $(call apt_install,PACKAGES,ON_FAILURE): install the Debian PACKAGES not installed yet (with
# sudo unless root); ON_FAILURE is a shell command run when that fails (empty: the rule fails).
define apt_install
missing=""; for p in $(1); do \
  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
  echo "installing:$$missing"; \
  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; } \
    $(if $(2),|| $(2)); \
fi
endef

deps:
	@$(call apt_install,$(DEB_PACKAGES),)

# The npm clients pinned in tests/server/e2e/package-lock.json (openai, @anthropic-ai/sdk, ai,
# @langchain/openai, playwright-core), and Debian's chromium for the chat page's browser test,
# for the server's end-to-end test (test_server_e2e skips what is missing).
E2E_DIR := tests/server/e2e
E2E_DEB_PACKAGES := chromium
e2e-deps:
	@$(call apt_install,$(E2E_DEB_PACKAGES),echo "warning: could not install$$missing: the chat page's browser test will be skipped")
	@if ! command -v npm >/dev/null 2>&1; then \
	  echo "warning: npm not found: test_server_e2e will be skipped"; \
	elif [ ! -f $(E2E_DIR)/node_modules/.package-lock.json ] || \
	     [ $(E2E_DIR)/package-lock.json -nt $(E2E_DIR)/node_modules/.package-lock.json ]; then \
	  (cd $(E2E_DIR) && npm ci --no-audit --no-fund --loglevel=error) || \
	    echo "warning: npm ci failed: test_server_e2e will be skipped"; \
	fi

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

build-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)

build-fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON \
	  -DKILN_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build build-fuzz -j $(JOBS)

run: build
	./build/kiln run -m "$(MODEL)" -p "$(PROMPT)" $(ARGS)

test-normal: build e2e-deps
	cd build && ctest --output-on-failure -j $(JOBS) -LE fuzz

test-asan: build-asan e2e-deps
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE fuzz

test-fuzz: build-fuzz
	cd build-fuzz && ctest --output-on-failure -L fuzz

test: test-normal test-asan test-fuzz

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-fuzz
